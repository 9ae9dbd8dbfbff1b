# List the Vulkan device extensions each physical device reports (through the loader, ctypes).
import ctypes
vk = ctypes.CDLL("libvulkan.so.1")
P = ctypes.c_void_p
class AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", P), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]
class InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", P), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", P), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", P)]
class ExtProps(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", ctypes.c_uint32)]
class DevProps(ctypes.Structure):
    _fields_ = [("apiVersion", ctypes.c_uint32), ("driverVersion", ctypes.c_uint32),
                ("vendorID", ctypes.c_uint32), ("deviceID", ctypes.c_uint32),
                ("deviceType", ctypes.c_int), ("deviceName", ctypes.c_char * 256),
                ("rest", ctypes.c_byte * 2048)]
app = AppInfo(0, None, b"vkext", 0, b"vkext", 0, (1 << 22) | (3 << 12))
info = InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
inst = P()
print("vkCreateInstance", vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(inst)))
vk.vkEnumeratePhysicalDevices.argtypes = [P, ctypes.POINTER(ctypes.c_uint32), P]
n = ctypes.c_uint32()
vk.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), None)
devs = (P * n.value)()
vk.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), devs)
vk.vkEnumerateDeviceExtensionProperties.argtypes = [P, P, ctypes.POINTER(ctypes.c_uint32), P]
vk.vkGetPhysicalDeviceProperties.argtypes = [P, P]
for d in devs:
    props = DevProps()
    vk.vkGetPhysicalDeviceProperties(d, ctypes.byref(props))
    m = ctypes.c_uint32()
    vk.vkEnumerateDeviceExtensionProperties(d, None, ctypes.byref(m), None)
    exts = (ExtProps * m.value)()
    vk.vkEnumerateDeviceExtensionProperties(d, None, ctypes.byref(m), exts)
    names = sorted(e.extensionName.decode() for e in exts)
    v = props.apiVersion
    print(f"{props.deviceName.decode()}: Vulkan {v >> 22}.{(v >> 12) & 0x3ff}.{v & 0xfff}, {len(names)} extensions")
    for x in names:
        print("  " + x)
