"""What every python probe starts with: host facts, syscall access, reporting."""

PRELUDE = r'''
import ctypes, errno, json, os, socket, struct, sys
H = json.loads(r"""@@HOST@@""")
# The start line (technique.start_line): proof that this program itself runs.
print(json.dumps({"started": "@@MARK@@"}), flush=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def sc(nr, *args):
    """A raw system call: (return value, errno name)."""
    ctypes.set_errno(0)
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ret = libc.syscall(ctypes.c_long(nr), *conv)
    return ret, (errno.errorcode.get(ctypes.get_errno(), "0") if ret < 0 else "")


def report(escaped, detail=""):
    print(json.dumps({"escaped": bool(escaped), "detail": str(detail)[:300]}), flush=True)


def na(reason):
    print(json.dumps({"na": reason}), flush=True)


def try_open(path, flags=os.O_RDONLY):
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)
    except OSError as exc:
        return None, errno.errorcode.get(exc.errno, str(exc.errno))
    return fd, ""


def read_text(path, limit=65536):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return None
'''
