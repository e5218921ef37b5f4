"""A gpumemd client for the real-systemd test (tests/system/systemd_check.sh),
over the installed libgpumem0 with ctypes, through the default socket.

  gm_client.py once            allocate 8 MiB, write and check it, free: "ok"
  gm_client.py hold GO_FILE    allocate and write 8 MiB, print "holding", wait
                               (at most 120 s) for GO_FILE, then check the
                               data, allocate again and free: "intact"
Exit 0 on success; 1 with libgpumem's error on stderr otherwise.
"""
import ctypes
import os
import sys
import time

SIZE = 8 << 20

lib = ctypes.CDLL("libgpumem.so.0")
lib.gpumem_connect.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
lib.gpumem_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p)]
lib.gpumem_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.gpumem_disconnect.argtypes = [ctypes.c_void_p]
lib.gpumem_last_error.argtypes = [ctypes.c_void_p]
lib.gpumem_last_error.restype = ctypes.c_char_p


def fail(what, client):
    message = lib.gpumem_last_error(client) or b""
    sys.stderr.write("%s: %s\n" % (what, message.decode(errors="replace")))
    sys.exit(1)


def alloc(client, size):
    ptr = ctypes.c_void_p()
    if lib.gpumem_alloc(client, size, 0, ctypes.byref(ptr)) < 0:
        fail("alloc", client)
    return ptr


def main():
    client = ctypes.c_void_p()
    if lib.gpumem_connect(None, ctypes.byref(client)) < 0:
        fail("connect", None)
    ptr = alloc(client, SIZE)
    pattern = bytes(range(256)) * (SIZE // 256)
    ctypes.memmove(ptr, pattern, SIZE)
    if sys.argv[1] == "hold":
        print("holding", flush=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(sys.argv[2]):
            if time.monotonic() > deadline:
                sys.exit("never told to go on")
            time.sleep(0.1)
    if ctypes.string_at(ptr, SIZE) != pattern:
        sys.exit("the data changed")
    again = alloc(client, SIZE)
    lib.gpumem_free(client, again)
    lib.gpumem_free(client, ptr)
    lib.gpumem_disconnect(client)
    print("intact" if sys.argv[1] == "hold" else "ok", flush=True)


main()
