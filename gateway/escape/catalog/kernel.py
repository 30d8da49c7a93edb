"""Kernel interfaces and privilege: knobs, devices, and the system calls that
widen what a process can reach. Nothing is written: opening a host knob for
writing is already the escape (and the host settings are compared anyway)."""

# Probe programs are data: their lines stay as the sandbox will run them.
# ruff: noqa: E501

from __future__ import annotations

from gateway.escape.technique import Technique, python


def _open_for_write(paths: list[str] | str) -> str:
    """`paths`: a list, or a python expression evaluated in the probe."""
    return (
        f"opened = []\nfor path in {paths if isinstance(paths, str) else repr(paths)}:\n"
        "    fd, err = try_open(path, os.O_WRONLY)\n"
        "    if fd is not None:\n        os.close(fd)\n        opened.append(path)\n"
        "report(opened, ', '.join(opened) or 'refused')\n"
    )


def _open_for_read(paths: list[str] | str) -> str:
    return (
        f"opened = []\nfor path in {paths if isinstance(paths, str) else repr(paths)}:\n"
        "    fd, err = try_open(path)\n"
        "    if fd is not None:\n        os.close(fd)\n        opened.append(path)\n"
        "report(opened, ', '.join(opened) or 'none present or openable')\n"
    )


def _syscall(call: str, success: str = "ret >= 0") -> str:
    """Run `call` (binds ret, err); escaped when `success` holds."""
    return f"ret, err = {call}\nreport({success}, f'ret={{ret}} {{err}}')\n"


# Errors that mean the kernel refused for lack of privilege (or the filter did).
DENIED = "err not in ('EPERM', 'ENOSYS', 'EACCES', 'ENOTSUP', 'EOPNOTSUPP')"
NS_USER_MOUNT = 0x10000000 | 0x00020000

TECHNIQUES = [
    Technique("kernel.sysrq_trigger", "kernel", "open /proc/sysrq-trigger for writing",
              python(_open_for_write(["/proc/sysrq-trigger"]))),
    Technique("kernel.core_pattern", "kernel", "open kernel.core_pattern for writing",
              python(_open_for_write(["/proc/sys/kernel/core_pattern"]))),
    Technique("kernel.modprobe", "kernel", "open kernel.modprobe / uevent_helper for writing",
              python(_open_for_write(["/proc/sys/kernel/modprobe", "/sys/kernel/uevent_helper"]))),
    Technique("kernel.binfmt_misc", "kernel", "register a binfmt_misc handler",
              python(_open_for_write(["/proc/sys/fs/binfmt_misc/register"]))),
    Technique("kernel.sysfs_knobs", "kernel", "open sysfs / sysctl knobs for writing",
              python(_open_for_write(["/sys/kernel/mm/transparent_hugepage/enabled",
                                      "/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname"]))),
    Technique("kernel.masked_proc", "kernel", "read /proc/kcore and /proc/kallsyms addresses",
              python(r"""
leaks = []
fd, err = try_open('/proc/kcore')
if fd is not None:
    leaks.append('/proc/kcore')
for line in (read_text('/proc/kallsyms', 4096) or '').splitlines()[:50]:
    if line and int(line.split()[0], 16) != 0:
        leaks.append('kallsyms addresses')
        break
report(leaks, ', '.join(leaks) or 'masked or zeroed')
""")),
    Technique("kernel.kmsg", "kernel", "read the host kernel log (/dev/kmsg, syslog(2))",
              python(r"""
buf = ctypes.create_string_buffer(4096)
n = libc.klogctl(3, buf, 4096)
text = buf.raw[:max(n, 0)].decode(errors='replace')
fd, err = try_open('/dev/kmsg')
host_log = (n > 0 and 'gVisor' not in text) or fd is not None
report(host_log, f'syslog={n} kmsg={err or "opened"}')
""")),
    Technique("kernel.dev_mem", "kernel", "open /dev/mem, /dev/kmem, /dev/port",
              python(_open_for_read(["/dev/mem", "/dev/kmem", "/dev/port"]))),
    Technique("kernel.disks", "kernel", "open the host's block devices",
              python("names = os.listdir('/sys/block') if os.path.isdir('/sys/block') else []\n"
                     "names += ['sda', 'vda', 'nvme0n1', 'xvda', 'dm-0', 'loop0']\n"
                     + _open_for_read("['/dev/' + n for n in names]"))),
    Technique("kernel.kvm_tun", "kernel", "open /dev/kvm, make a tun interface",
              python(r"""
import fcntl
made = []
for path in ('/dev/kvm', '/dev/vhost-net'):
    fd, err = try_open(path)
    if fd is not None:
        made.append(path)
fd, err = try_open('/dev/net/tun', os.O_RDWR)
if fd is not None:
    try:  # TUNSETIFF, IFF_TUN | IFF_NO_PI: an opened node alone creates nothing
        fcntl.ioctl(fd, 0x400454CA, struct.pack('16sH22x', b'execgate0', 0x1001))
        made.append('tun interface')
    except OSError as exc:
        err = f'TUNSETIFF: {exc}'
report(made, ', '.join(made) or f'tun: {err}')
""")),
    Technique("kernel.mknod", "kernel", "mknod a /dev/mem character device and open it",
              python(r"""
import stat
made = []
for where in ('/tmp', '/workspace'):
    path = where + '/execgate-mem'
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 1))
    except OSError:
        continue
    fd, err = try_open(path)
    if fd is not None:
        made.append(path)
        os.close(fd)
report(made, ', '.join(made) or 'refused')
""")),
    Technique("privilege.mount", "privilege", "mount a tmpfs, remount / read-write",
              python(_syscall("sc(165, b'none', b'/tmp', b'tmpfs', 0, 0)"))),
    Technique("privilege.unshare", "privilege", "unshare a user + mount namespace",
              python(_syscall(f"sc(272, {NS_USER_MOUNT})", "ret == 0"))),
    Technique("privilege.setns", "privilege", "setns into another process's namespaces",
              python(r"""
joined = []
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    for name in ('net', 'mnt'):
        fd, err = try_open(f'/proc/{pid}/ns/{name}')
        if fd is None:
            continue
        ret, err = sc(308, fd, 0)
        os.close(fd)
        try:  # after joining a mount namespace, its /proc may show no such link
            now = os.readlink(f'/proc/self/ns/{name}') if ret == 0 else ''
        except OSError as exc:
            now = str(exc)
        if ret == 0 and now == H['ns'].get(name):
            joined.append(f'{pid}/{name}')
report(joined, ', '.join(joined) or 'no host namespace joined')
""")),
    Technique("privilege.clone_ns", "privilege", "clone(2) and clone3(2) with CLONE_NEWUSER",
              python(r"""
flags = 0x10000000 | 17
made = []
ret, err = sc(56, flags, 0, 0, 0, 0)
if ret == 0:
    sc(231, 0)
if ret > 0:
    os.waitpid(ret, 0)
    made.append('clone')
args = struct.pack('QQQQQQQQ', 0x10000000, 0, 0, 0, 17, 0, 0, 0)
buf = ctypes.create_string_buffer(args)
ret3, err3 = sc(435, ctypes.addressof(buf), len(args))
if ret3 == 0:
    sc(231, 0)
if ret3 > 0:
    os.waitpid(ret3, 0)
    made.append('clone3')
# Under gVisor clone3 is allowed (runsc drops errnoRet, see backends/docker/gvisor.py): the
# namespace it makes is gVisor's own, its kernel's, not the host's.
gvisor = ' - 9p ' in (read_text('/proc/self/mountinfo') or '').split('\n')[0]
if gvisor and made == ['clone3']:
    made = []
    err3 += ' (a namespace of gVisor\'s kernel)'
report(made, f'clone={ret} {err} clone3={ret3} {err3}')
""")),
    Technique("privilege.release_agent", "privilege", "write a cgroup v1 release_agent",
              python("import glob\n"
                     + _open_for_write("glob.glob('/sys/fs/cgroup/*/release_agent')"
                                     " + glob.glob('/sys/fs/cgroup/release_agent')"))),
    Technique("privilege.cgroup_limits", "privilege", "raise its own cgroup's limits",
              python(r"""
paths = []
for line in (read_text('/proc/self/cgroup') or '').splitlines():
    rel = line.split(':', 2)[-1]
    for knob in ('memory.max', 'pids.max', 'cpu.max', 'memory/memory.limit_in_bytes',
                 'pids/pids.max'):
        paths += ['/sys/fs/cgroup' + rel + '/' + knob, '/sys/fs/cgroup/' + knob]
""" + _open_for_write("sorted(set(paths))"))),
    Technique("privilege.setuid_binaries", "privilege", "gain privilege through setuid or file-capability binaries",
              python(r"""
import stat
nnp = 'NoNewPrivs:\t1' in read_text('/proc/self/status')
found = []
for root in ('/usr/bin', '/usr/sbin', '/usr/lib', '/bin', '/sbin'):
    for dirpath, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o6000 and st.st_uid == 0:
                found.append(path)
            elif stat.S_ISREG(st.st_mode):
                try:
                    os.getxattr(path, 'security.capability', follow_symlinks=False)
                    found.append(path)
                except OSError:
                    pass
nosuid = any(' nosuid' in l or ',nosuid' in l for l in (read_text('/proc/self/mounts') or '').splitlines() if ' /usr ' in l)
report(found and not nnp and not nosuid, f'{len(found)} setuid files, no_new_privs={nnp}')
""")),
    Technique("privilege.keyctl", "privilege", "add a key to the kernel keyring",
              python(_syscall("sc(248, b'user', b'execgate-probe', b'x', 1, -2)"))),
    Technique("privilege.bpf", "privilege", "create a BPF map",
              python("attr = ctypes.create_string_buffer(struct.pack('IIII', 2, 4, 4, 1), 128)\n"
                     + _syscall("sc(321, 0, ctypes.addressof(attr), 128)"))),
    Technique("privilege.perf_event_open", "privilege", "open a perf event",
              python("attr = ctypes.create_string_buffer(struct.pack('II', 1, 128), 128)\n"
                     + _syscall("sc(298, ctypes.addressof(attr), 0, -1, -1, 0)"))),
    Technique("privilege.userfaultfd", "privilege", "create a userfaultfd (user-mode only)",
              python(_syscall("sc(323, 0o2000000 | 1)"))),
    Technique("privilege.io_uring", "privilege", "set up an io_uring",
              python("params = ctypes.create_string_buffer(120)\n"
                     + _syscall("sc(425, 4, ctypes.addressof(params))"))),
    Technique("privilege.module_load", "privilege", "load a kernel module",
              python(_syscall("sc(313, -1, b'', 0)", DENIED))),
    Technique("privilege.kexec", "privilege", "load a kexec kernel",
              python(_syscall("sc(246, 0, 0, 0, 0)", DENIED))),
    Technique("privilege.open_by_handle_at", "privilege", "open a file by handle (shocker)",
              python("handle = ctypes.create_string_buffer(struct.pack('Ii', 8, 1) + b'\\x02' + b'\\0' * 7)\n"
                     "fd = os.open('/', os.O_RDONLY)\n"
                     + _syscall("sc(304, fd, ctypes.addressof(handle), 0)", DENIED))),
    Technique("privilege.chroot", "privilege", "chroot (a step of many breakouts)",
              python(_syscall("sc(161, b'/tmp')", "ret == 0"))),
    Technique("privilege.x32_syscalls", "privilege", "unshare through the x32 syscall numbers",
              python(_syscall(f"sc(0x40000000 | 272, {NS_USER_MOUNT})", "ret == 0"))),
    Technique("privilege.int80", "privilege", "32-bit syscalls through int 0x80",
              python(r"""
# Machine code: mov eax, 310 (i386 unshare is 310); mov ebx, CLONE_NEWUSER; int 0x80; ret
import mmap
code = b'\xb8' + struct.pack('<I', 310) + b'\xbb' + struct.pack('<I', 0x10000000) + b'\xcd\x80\xc3'
mem = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
mem.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
fn = ctypes.CFUNCTYPE(ctypes.c_int)(addr)
ret = fn()
report(ret == 0, f'int 0x80 unshare returned {ret}')
""")),
]  # fmt: skip
