//! f64 CPU references: the executable contract of every operator, written to be read.
//! Forward and analytic backward of each family, used by the tests, the `check` example and
//! the benches, and public so users can reuse them.

pub mod attention;
pub mod reduce;
