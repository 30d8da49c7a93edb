"""PID 1 of every docker / docker-gvisor sandbox: receives one request, runs it once.

This file is not imported by the gateway: its source is the container's command
(`python3 -I -S -c <this file>`), so it works in any image that has a python3 and
must stay standard-library only and compatible with older Pythons (3.7+).

It runs as the image's unprivileged user with no capabilities. Started ahead of
the request, it announces itself, then reads the request from stdin (a length-
prefixed JSON header, then the code, the input files and the program's stdin, each
of an announced size), writes the code to /code and the files to /workspace, and
runs the program with pipes for its stdio. Everything it sends back on stdout is
framed: type (1 byte), length (4 bytes, big endian), payload:

    R  ready, before the request          O / E  a chunk of the program's stdout / stderr
    F  an output file: u16 path length, path, content
    S  a note about a file left out       X  the exit report (JSON), always last

When the program exits, everything else in the container is killed (kill -1 from
PID 1 spares only PID 1), the workspace is read, regular files only and never
following links, with nothing left running that could swap a file, and the exit
report, carrying the request's nonce, is the last thing written before this
process exits with the program's status. See backends/docker/protocol.py for what
the host believes of it.
"""

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import resource
import selectors
import signal
import stat
import struct
import sys
import time

CHUNK = 1 << 16
WORKSPACE = "/workspace"
CODE_DIR = "/code"
MAX_DEPTH = 32


def send(kind, payload=b""):
    data = kind + struct.pack(">I", len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def read_exact(size):
    chunks = []
    while size > 0:
        chunk = os.read(0, min(size, CHUNK))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def plain_path(path):
    parts = path.split("/")
    if (
        not path
        or "\x00" in path
        or path.startswith("/")
        or len(parts) > MAX_DEPTH
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(f"input file path {path!r} is not a plain relative path")
    return parts


def write_stream(path, size, mode):
    """Copy `size` bytes of stdin into a new file (never through a link)."""
    digest = hashlib.sha256()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        while size > 0:
            chunk = os.read(0, min(size, CHUNK))
            if not chunk:
                raise EOFError
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            size -= len(chunk)
    finally:
        os.close(fd)
    return digest.digest()


def receive_files(request):
    code_path = os.path.join(CODE_DIR, request["filename"])
    write_stream(code_path, request["code_bytes"], 0o444)
    os.chmod(CODE_DIR, 0o555)  # tidiness: the code is the program's own anyway
    inputs = {}
    for path, size in request["files"]:
        parts = plain_path(path)
        if path in inputs:
            raise ValueError(f"input file {path!r} given twice")
        directory = WORKSPACE
        for part in parts[:-1]:
            directory = os.path.join(directory, part)
            try:
                os.mkdir(directory, 0o755)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(directory).st_mode):
                    raise ValueError(f"input file {path!r} collides with another") from None
        inputs[path] = write_stream(os.path.join(WORKSPACE, path), size, 0o644)
    return code_path, inputs


def start_program(request, code_path):
    fds = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            for target, pair in enumerate(fds):
                os.dup2(pair[0] if target == 0 else pair[1], target)
            os.closerange(3, 4096)
            os.chdir(WORKSPACE)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            argv = [*request["argv"], code_path]
            os.execve(argv[0], argv, request["env"])
        except BaseException as exc:
            os.write(2, f"execgate: cannot run {request['argv'][0]}: {exc}\n".encode())
        os._exit(127)
    os.close(fds[0][0])
    os.close(fds[1][1])
    os.close(fds[2][1])
    return pid, fds[0][1], fds[1][0], fds[2][0]


def start_relay(target):
    """docker-gvisor with egress: the program's proxy address, 127.0.0.1:3128, is on
    gVisor's own loopback; relay it to the gateway's proxy on the container's link.
    Bound before the program starts; the relay child dies with everything else."""
    import socket
    import threading

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 3128))
    listener.listen(64)
    if os.fork() != 0:
        listener.close()
        return
    try:
        os.closerange(0, 3)  # never a byte on the framed stream
        slots = threading.BoundedSemaphore(64)

        def pipe(src, dst):
            with contextlib.suppress(OSError):
                while True:
                    data = src.recv(CHUNK)
                    if not data:
                        break
                    dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        def serve(client):
            try:
                with client, socket.create_connection(tuple(target), timeout=10) as up:
                    up.settimeout(None)
                    other = threading.Thread(target=pipe, args=(up, client), daemon=True)
                    other.start()
                    pipe(client, up)
                    other.join()
            except OSError:
                pass
            finally:
                slots.release()

        while True:
            client, _ = listener.accept()
            slots.acquire()
            threading.Thread(target=serve, args=(client,), daemon=True).start()
    finally:
        os._exit(0)


def kill_everything(pid=None):
    """Kill every process but this one and reap them all (PID 1 is spared by kill -1);
    return the wait status of `pid` if it was among them."""
    status = None
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        try:
            while True:
                found, code = os.waitpid(-1, os.WNOHANG)
                if found == 0:
                    break
                if found == pid:
                    status = code
        except ChildProcessError:
            return status
        time.sleep(0.001)


def supervise(request, stdin_left, stdin_w, out_r, err_r, pid):
    """Relay stdin and output until the program exits; return its wait status."""
    deadline = time.monotonic() + request["backstop_s"]
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w, stdin_w, out_r, err_r, 0):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(wake_r, selectors.EVENT_READ)
    sel.register(out_r, selectors.EVENT_READ, b"O")
    sel.register(err_r, selectors.EVENT_READ, b"E")
    pending = b""
    if stdin_left:
        sel.register(0, selectors.EVENT_READ)
    else:
        os.close(stdin_w)
        stdin_w = -1
    status = None
    backstop = False
    open_streams = 2
    # Until the program has exited and both pipes are closed (a program may close
    # its stdout early and go on).
    while open_streams or status is None:
        timeout = max(0.0, deadline - time.monotonic())
        for key, _ in sel.select(timeout if status is None else 1.0):
            fd = key.fd
            if fd == wake_r:
                os.read(wake_r, 4096)
            elif fd == 0:
                chunk = os.read(0, min(stdin_left, CHUNK))
                if not chunk:
                    raise EOFError
                stdin_left -= len(chunk)
                pending += chunk
                sel.unregister(0)
                if stdin_w >= 0:
                    sel.register(stdin_w, selectors.EVENT_WRITE)
            elif fd == stdin_w:
                try:
                    pending = pending[os.write(stdin_w, pending) :]
                except BrokenPipeError:
                    # The program will not read more: what is still to come is dropped
                    # (the container ends before the host could block on it).
                    pending, stdin_left = b"", 0
                if not pending:
                    sel.unregister(stdin_w)
                    if stdin_left:
                        sel.register(0, selectors.EVENT_READ)
                    else:
                        os.close(stdin_w)
                        stdin_w = -1
            else:
                chunk = os.read(fd, CHUNK)
                if chunk:
                    send(key.data, chunk)
                else:
                    sel.unregister(fd)
                    open_streams -= 1
        if status is None:
            status = reap(pid)
            if status is None and time.monotonic() >= deadline:
                backstop = True
                status = kill_everything(pid)
                if status is None:  # reaped unseen: it was killed all the same
                    status = signal.SIGKILL
            if status is not None:
                # The program is done: nothing it started may go on (or keep a pipe open).
                kill_everything()
    kill_everything()
    return status, backstop


def reap(pid):
    try:
        while True:
            found, status = os.waitpid(-1, os.WNOHANG)
            if found == 0:
                return None
            if found == pid:
                return status
    except ChildProcessError:
        return None


def disk_full():
    for path in (WORKSPACE, "/tmp"):
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        # gVisor's tmpfs counts no inodes (f_files == 0): only blocks tell there.
        if st.f_bavail == 0 or (st.f_files and st.f_favail == 0):
            return True
    return False


def send_files(request, inputs):
    max_files, max_file, max_total = (
        request["max_files"],
        request["max_file_bytes"],
        request["max_total_bytes"],
    )
    sent, total = 0, 0
    for rel, path in regular_files():
        content = read_regular(path, max_file)
        if content is None:
            send(b"S", f"{rel}: not a regular file or over {max_file} bytes".encode())
            continue
        if rel in inputs and hashlib.sha256(content).digest() == inputs[rel]:
            continue  # an input file, unchanged
        if sent >= max_files:
            send(b"S", f"{rel}: more than {max_files} output files".encode())
            continue
        if total + len(content) > max_total:
            send(b"S", f"{rel}: output files over {max_total} bytes in total".encode())
            continue
        name = rel.encode()
        send(b"F", struct.pack(">H", len(name)) + name + content)
        sent += 1
        total += len(content)


def regular_files():
    found = []
    stack = [(WORKSPACE, "", 0)]
    while stack:
        directory, prefix, depth = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            rel = prefix + entry.name
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                send(b"S", f"{rel!r}: file name is not UTF-8".encode())
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth < MAX_DEPTH:
                    stack.append((entry.path, rel + "/", depth + 1))
            elif entry.is_file(follow_symlinks=False):
                found.append((rel, entry.path))
            else:
                send(b"S", f"{rel}: not a regular file".encode())
    return sorted(found)


def read_regular(path, max_bytes):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks) if size <= max_bytes else None
    finally:
        os.close(fd)


def main():
    # Not dumpable: other processes of this uid cannot ptrace this one or open its
    # /proc entries (its descriptors carry the frames). PR_SET_DUMPABLE = 4.
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    send(b"R")
    try:
        size = struct.unpack(">I", read_exact(4))[0]
    except EOFError:
        return 0  # never used (the host went away): nothing to do
    request = json.loads(read_exact(size))
    try:
        code_path, inputs = receive_files(request)
    except (OSError, ValueError) as exc:
        full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        problem = "the code and input files do not fit in the disk limit" if full else str(exc)
        send(b"X", json.dumps({"nonce": request["nonce"], "setup_error": problem}).encode())
        return 125
    if request.get("proxy_relay"):
        start_relay(request["proxy_relay"])
    pid, stdin_w, out_r, err_r = start_program(request, code_path)
    status, backstop = supervise(request, request["stdin_bytes"], stdin_w, out_r, err_r, pid)
    full = disk_full()
    send_files(request, inputs)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = {
        "nonce": request["nonce"],
        "wait_status": status,
        "backstop": backstop,
        "disk_full": full,
        "cpu_ms": int((usage.ru_utime + usage.ru_stime) * 1000),
        "max_rss_kb": usage.ru_maxrss,
    }
    send(b"X", json.dumps(report).encode())
    if status is None:
        return 137
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
