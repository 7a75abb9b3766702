"""libcuda through ctypes for the GPU test jobs (fork_jobs.py, scan_jobs.py): no torch, small images."""

import ctypes

u64 = ctypes.c_uint64


def check(name, rc):
    if rc != 0:
        raise RuntimeError("%s failed: CUresult %d" % (name, rc))


def libcuda():
    """libcuda.so.1 with the argument types of the calls the jobs make."""
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuInit.argtypes = [ctypes.c_uint]
    cu.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t]
    cu.cuMemAllocManaged.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t, ctypes.c_uint]
    cu.cuMemsetD8_v2.argtypes = [u64, ctypes.c_ubyte, ctypes.c_size_t]
    cu.cuMemsetD32_v2.argtypes = [u64, ctypes.c_uint, ctypes.c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, u64, ctypes.c_size_t]
    cu.cuMemcpyHtoD_v2.argtypes = [u64, ctypes.c_void_p, ctypes.c_size_t]
    cu.cuDeviceGetPCIBusId.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    cu.cuDeviceGetUuid_v2.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return cu


def primary_context(cu, ordinal=0):
    """cuInit, then ordinal's primary context made current; returns the device."""
    check("cuInit", cu.cuInit(0))
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), ordinal))
    check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    return dev
