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

Started ahead (`start_interpreter_ahead`, the default), its EXECGATE_AHEAD variable
names the program to come (interpreter argv, code file name, environment, and under gVisor
the proxy relay): before announcing itself it puts a FIFO where the code file will
be and starts the interpreter on it, which does its whole start-up and blocks
reading the FIFO; ready is sent once it has opened it. The request's code is then
written beside the FIFO, renamed over it, and the same bytes (or those the host
sent for the pipe: Python's source encodings, backends/handover.py) are fed into
the pipe, which is then closed: the interpreter reads its program to EOF and runs
it as it would have run the file. Code that an empty pipe holds (64 KiB) goes in
from memory, not read back from its file; and when the header says the interpreter
compiles its whole program before running any of it (`whole`: Python, node; never
a shell, which runs each line as it reads it) it goes in before the file is
written, so that the interpreter's wake-up (~1 ms under gVisor) overlaps that work:
the pipe's end, which it waits for, still comes only after the rename. An
interpreter that exited before the request (a broken runtime), or one the request
asks to replace (`fresh`), is started again, cold, once the code is there.
"""

import errno
import fcntl
import os

# os.wait4 imports it for the usage it returns (on every call, even WNOHANG's with
# nothing to reap): here at start-up, not during a request.
import resource
import select
import stat
import sys
import time

# This file's start-up is part of every container's, so it imports only what every
# request needs, and not through modules whose own imports cost more than the work:
# signal.py turns every constant into an enum and json.decoder compiles regular
# expressions, which together were a third of this process's start-up (and far more
# under gVisor's ptrace platform, where every file an import opens is a round trip).
# Their C halves do the same work; the public modules stay the fallback.
try:
    import _signal as signal
except ImportError:  # pragma: no cover - an interpreter without the C module
    import signal
try:
    import _json
except ImportError:  # pragma: no cover
    _json = None
try:
    import _struct as struct  # struct.py only re-exports it, from a file of its own
except ImportError:  # pragma: no cover
    import struct
# ctypes' C half is enough for the one call into libc (prctl); ctypes itself adds its
# package, its endianness module and their file lookups to every container's start.
try:
    import _ctypes
except ImportError:  # pragma: no cover - an interpreter built without ctypes
    _ctypes = None
# Built into Debian's interpreter (no file to open, unlike hashlib's libcrypto). Nothing
# is imported after start-up: an import during a request would be its latency, and
# under gVisor its file lookups would sit in the execution's syscall trace.
try:
    from _sha256 import sha256
except ImportError:  # pragma: no cover - 3.12+ names it _sha2; others: hashlib
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256

CHUNK = 1 << 16
# Code up to this size is handed over from memory: an empty pipe holds it (Linux's
# and gVisor's default capacity) and the file is not read back.
PIPE_BYTES = 1 << 16
WORKSPACE = "/workspace"
CODE_DIR = "/code"
MAX_DEPTH = 32
F_SETPIPE_SZ = 1031  # fcntl's name for it is 3.10+
# How long the interpreter started ahead may take to reach its code file before the
# launcher says it is ready all the same (the hand-over then still works).
AHEAD_WAIT_S = 20.0
# Connections the gVisor proxy relay carries at once; more are closed as they come.
RELAY_CONNECTIONS = 64


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


class _Strict:
    """What _json's scanner reads from json.JSONDecoder: plain, strict JSON."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"{name} is not JSON")


def json_loads(text):
    """The host's JSON (the request header, the program to start ahead)."""
    if _json is None:
        import json

        return json.loads(text)
    try:
        value, end = _json.make_scanner(_Strict)(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if text[end:].strip(" \t\n\r"):
        raise ValueError("extra data after the JSON value")
    return value


def json_dumps(report):
    """A report: a flat object of strings, integers, booleans and nulls."""
    if _json is None:
        import json

        return json.dumps(report)
    quote = _json.encode_basestring_ascii
    items = []
    for key, value in report.items():
        if value is None or isinstance(value, bool):
            text = {None: "null", True: "true", False: "false"}[value]
        elif isinstance(value, int):
            text = str(int(value))
        else:
            text = quote(str(value))
        items.append(quote(key) + ":" + text)
    return "{" + ",".join(items) + "}"


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


def fits_pipe(request):
    """Whether the code (and what the pipe is to carry instead) is small enough to
    hold in memory and to fit an empty pipe at once."""
    return max(request["code_bytes"], request.get("pipe_bytes") or 0) <= PIPE_BYTES


def write_bytes(path, data, mode):
    """`data` into a new file (never through a link)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def write_some(fd, view):
    """As much of `view` as the non-blocking `fd` takes now; the rest (None when
    the reader has gone: it will not read more)."""
    try:
        while view:
            view = view[os.write(fd, view) :]
    except BlockingIOError:
        pass
    except OSError:  # EPIPE
        return None
    return view


def write_stream(path, size, mode):
    """Copy `size` bytes of stdin into a new file (never through a link)."""
    digest = sha256()
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


def receive_files(request, warm=None):
    """The code (beside the FIFO when an interpreter waits on it) and the input
    files; with `warm`, also what the pipe is to carry, if the host sent its own."""
    code_path = os.path.join(CODE_DIR, request["filename"])
    if warm is not None:
        code_path = os.path.join(CODE_DIR, "." + os.path.basename(warm.path) + ".staged")
    if warm is not None and not warm.exited and fits_pipe(request):
        # Small code goes into the pipe from memory, not read back from its file.
        code = read_exact(request["code_bytes"])
        warm.pending = memoryview(read_exact(request["pipe_bytes"]) or code)
        if request.get("whole"):
            # This interpreter compiles its whole program before it runs any of it,
            # and it cannot see the end of the pipe before the rename: it may wake
            # now, while the file is written (a wake-up is ~1 ms under gVisor).
            warm.pending = write_some(warm.fifo, warm.pending)
        write_bytes(code_path, code, 0o444)
        warm.staged = code_path
        code_path = warm.path
    elif warm is not None:
        write_stream(code_path, request["code_bytes"], 0o444)
        if request.get("pipe_bytes"):
            warm.source = os.path.join(CODE_DIR, ".pipe")
            write_stream(warm.source, request["pipe_bytes"], 0o400)
        warm.staged = code_path
        code_path = warm.path
    else:
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
    # The supervisor's ends never block; set here, so that for an interpreter started
    # ahead it is done before the request (under gVisor every system call on the
    # request's path is a round trip into the Sentry, ~0.1 ms each on a small host).
    for fd in (fds[0][1], fds[1][0], fds[2][0]):
        os.set_blocking(fd, False)
    return pid, fds[0][1], fds[1][0], fds[2][0]


class Warm:
    """The interpreter started ahead, on the FIFO at `path`, and its pipes."""

    def __init__(self, path, pid, stdin_w, out_r, err_r):
        self.path = path
        self.pid, self.stdin_w, self.out_r, self.err_r = pid, stdin_w, out_r, err_r
        self.fifo = -1  # the FIFO's write end, once the interpreter has opened it
        self.exited = False
        self.staged = ""
        self.source = ""  # what the pipe carries ("": the code file itself)
        self.pending = None  # or the bytes still to go into the pipe, from memory

    def close_pipes(self):
        for fd in (self.stdin_w, self.out_r, self.err_r, self.fifo):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fifo = -1


def start_ahead(ahead):
    """Start the interpreter on a FIFO at the code file's path; return once it has
    opened it (its start-up done), exited, or taken AHEAD_WAIT_S."""
    path = os.path.join(CODE_DIR, ahead["filename"])
    os.mkfifo(path, 0o644)
    program = {"argv": ahead["argv"], "env": ahead["env"]}
    warm = Warm(path, *start_program(program, path))
    deadline = time.monotonic() + AHEAD_WAIT_S
    pause = 0.0005
    while warm.fifo < 0:
        try:
            # Refused (ENXIO) until a reader has the FIFO open (or is blocked
            # opening it): the interpreter has reached its code.
            warm.fifo = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if os.wait4(warm.pid, os.WNOHANG)[0] == warm.pid:  # as `reap` will
                warm.exited = True
                warm.close_pipes()
                return warm
            if time.monotonic() >= deadline:
                # Read-write never waits for a reader nor fails on its absence.
                warm.fifo = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
    return warm


def hand_over(warm):
    """The code file in place of the FIFO, and what the pipe is to carry opened;
    as much written into the pipe as it holds. Returns (pipe fd, source fd), or
    (-1, -1) when everything is written."""
    os.rename(warm.staged, warm.path)
    if warm.pending is not None and not warm.exited:
        os.chmod(CODE_DIR, 0o555)
        fifo, warm.fifo = warm.fifo, -1
        return feed_code(fifo, warm.pending)
    source = os.open(warm.source or warm.path, os.O_RDONLY | os.O_CLOEXEC)
    if warm.source:
        os.unlink(warm.source)
    os.chmod(CODE_DIR, 0o555)
    if warm.exited:  # started again, cold, on the code file
        os.close(source)
        return -1, -1
    size = os.fstat(source).st_size
    if size > 1 << 16:
        for want in (size, 1 << 20):
            try:
                fcntl.fcntl(warm.fifo, F_SETPIPE_SZ, want)
                break
            except OSError:
                continue
    fifo, warm.fifo = warm.fifo, -1
    return feed_code(fifo, source)


def feed_code(fifo, source):
    """Write into the pipe until it is full or the code is all in; (-1, -1) once
    done, else the pair to go on with when the pipe has room. `source`: a file
    descriptor to read the code from, or the code's bytes still to write."""
    if not isinstance(source, int):
        left = write_some(fifo, source)
        if left:
            return fifo, left
        os.close(fifo)
        return -1, -1
    while True:
        chunk = os.pread(source, CHUNK, os.lseek(source, 0, os.SEEK_CUR))
        if not chunk:
            break
        try:
            written = os.write(fifo, chunk)
        except BlockingIOError:
            return fifo, source
        except OSError:  # EPIPE: the interpreter will not read more
            break
        os.lseek(source, written, os.SEEK_CUR)
    os.close(fifo)
    os.close(source)
    return -1, -1


def start_relay(target):
    """docker-gvisor with egress: the program's proxy address, 127.0.0.1:3128, is on
    gVisor's own loopback; relay it to the gateway's proxy on the container's link.

    Bound before the program starts; served by threads of this process (PID 1, which
    nothing in the sandbox can kill or trace), started by `serve()` once no fork is to
    follow, and shut down by `stop()` once the program's processes are dead. A relay
    process of its own had to be killed and waited for at the end of every execution,
    ~2 ms under gVisor, where waking a blocked task is slow. Returns serve and stop.
    """
    # The C half of socket: `socket` itself imports selectors, collections and enum,
    # ~70 ms under gVisor (every module a round trip), paid by every container with
    # egress. A plain IP address to connect to needs none of what it adds.
    import _socket
    import _thread

    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 3128))
    listener.listen(64)
    host, port = target
    family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
    lock = _thread.allocate_lock()
    held = {listener}  # every socket of the relay, shut down by stop()
    state = {"stopped": False, "active": 0}

    def hold(sock):
        with lock:
            if state["stopped"]:
                raise OSError("the relay is stopped")
            held.add(sock)

    def pipe(src, dst, done=None):
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(_socket.SHUT_WR)
        except OSError:
            pass
        if done is not None:
            done.release()

    def relay(client):
        up = None
        try:
            hold(client)
            up = _socket.socket(family, _socket.SOCK_STREAM)
            hold(up)  # before the connect: stop() ends a connect still under way
            up.settimeout(10)
            up.connect((host, port))
            up.settimeout(None)
            done = _thread.allocate_lock()
            done.acquire()
            _thread.start_new_thread(pipe, (up, client, done))
            pipe(client, up)
            done.acquire()  # both directions over
        except (OSError, RuntimeError):  # RuntimeError: no thread to be had
            pass
        finally:
            client.close()
            if up is not None:
                up.close()
            with lock:
                state["active"] -= 1

    def accept():
        while True:
            try:
                fd, _ = listener._accept()
            except OSError:
                return  # stopped
            # As socket.accept() does, with the family and type known (no getsockopt).
            client = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
            with lock:
                room = state["active"] < RELAY_CONNECTIONS and not state["stopped"]
                if room:
                    state["active"] += 1
            if room:
                try:
                    _thread.start_new_thread(relay, (client,))
                    continue
                except RuntimeError:  # no thread: the uid's process limit is the program's too
                    with lock:
                        state["active"] -= 1
            client.close()  # refused; the relay goes on

    def serve():
        _thread.start_new_thread(accept, ())

    def stop():
        with lock:
            state["stopped"] = True
            socks = list(held)
        for sock in socks:  # their threads see the end; nothing more goes through
            try:
                sock.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
        listener.close()

    return serve, stop


class Usage:
    """What the program's processes used, summed from each one's wait4 as it is
    reaped: what getrusage(RUSAGE_CHILDREN) says, without a system call after the
    program's end (under gVisor each costs 0.2-0.9 ms there, its exit still being
    torn down), and without an interpreter started ahead that was not the program."""

    def __init__(self):
        self.cpu_s = 0.0
        self.max_rss_kb = 0

    def add(self, rusage):
        self.cpu_s += rusage.ru_utime + rusage.ru_stime
        self.max_rss_kb = max(self.max_rss_kb, rusage.ru_maxrss)


def kill_everything(usage, pid=None):
    """Kill every process but this one and reap them all (PID 1 is spared by kill -1);
    return the wait status of `pid` if it was among them."""
    status = None
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            # Nothing to signal: no process, and no zombie either (kill -1 counts
            # those, on Linux and gVisor alike), so nothing is left to reap.
            return status
        try:
            # Waits for one of them to be gone: each was just sent SIGKILL, which
            # nothing can ignore or outlive. Then kill -1 again, for whatever a dying
            # process forked before the signal reached it; done when nothing is
            # left (every orphan of the namespace is this process's child). Polling
            # with a sleep instead cost ~4 ms per execution under gVisor.
            found, code, rusage = os.wait4(-1, 0)
        except ChildProcessError:
            return status
        usage.add(rusage)
        if found == pid:
            status = code


def watch_children():
    """The pipe a child's exit wakes the supervisor through (SIGCHLD's wake-up fd):
    made before the request, so that none of its system calls is on the request's
    path. Returns its read end."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, _on_child)
    signal.set_wakeup_fd(wake_w)
    return wake_r


def _on_child(signum, frame):
    pass  # the wake-up fd is what wakes the supervisor's poll


def supervise(request, usage, wake_r, stdin_left, stdin_w, out_r, err_r, pid, code_feed=(-1, -1)):
    """Relay stdin and output (and the rest of the code into an interpreter started
    ahead) until the program exits; return its wait status. The program's pipes are
    non-blocking on this side already (start_program)."""
    deadline = time.monotonic() + request["backstop_s"]
    os.set_blocking(0, False)
    poller = select.poll()
    for fd in (wake_r, out_r, err_r):
        poller.register(fd, select.POLLIN)
    frame_kind = {out_r: b"O", err_r: b"E"}
    fifo, source = code_feed
    if fifo >= 0:
        poller.register(fifo, select.POLLOUT)
    pending = b""
    if stdin_left:
        poller.register(0, select.POLLIN)
    else:
        os.close(stdin_w)
        stdin_w = -1
    status = None
    backstop = False
    open_streams = 2
    # Until the program has exited and both pipes are closed (a program may close
    # its stdout early and go on).
    while open_streams or status is None:
        timeout = max(0.0, deadline - time.monotonic()) if status is None else 1.0
        # Any event on a descriptor (hang-up and error too) is answered by the read or
        # write it was watched for, which then sees the end or the error.
        for fd, _ in poller.poll(int(timeout * 1000 + 0.999)):
            if fd == wake_r:
                os.read(wake_r, 4096)
            elif fd == fifo:
                poller.unregister(fifo)
                fifo, source = feed_code(fifo, source)
                if fifo >= 0:
                    poller.register(fifo, select.POLLOUT)
            elif fd == 0:
                chunk = os.read(0, min(stdin_left, CHUNK))
                if not chunk:
                    raise EOFError
                stdin_left -= len(chunk)
                pending += chunk
                poller.unregister(0)
                if stdin_w >= 0:
                    poller.register(stdin_w, select.POLLOUT)
            elif fd == stdin_w:
                try:
                    pending = pending[os.write(stdin_w, pending) :]
                except BrokenPipeError:
                    # The program will not read more: what is still to come is dropped
                    # (the container ends before the host could block on it).
                    pending, stdin_left = b"", 0
                if not pending:
                    poller.unregister(stdin_w)
                    if stdin_left:
                        poller.register(0, select.POLLIN)
                    else:
                        os.close(stdin_w)
                        stdin_w = -1
            else:
                chunk = os.read(fd, CHUNK)
                if chunk:
                    send(frame_kind[fd], chunk)
                else:
                    poller.unregister(fd)
                    open_streams -= 1
        if status is None:
            status = reap(pid, usage)
            if status is None and time.monotonic() >= deadline:
                backstop = True
                status = kill_everything(usage, pid)
                if status is None:  # reaped unseen: it was killed all the same
                    status = signal.SIGKILL
            if status is not None:
                # The program is done: nothing it started may go on (or keep a pipe open).
                # Once it returns no process but this one is left in the namespace.
                kill_everything(usage)
    for fd in (fifo, source):
        if isinstance(fd, int) and fd >= 0:
            os.close(fd)
    return status, backstop


def reap(pid, usage):
    try:
        while True:
            found, status, rusage = os.wait4(-1, os.WNOHANG)
            if found == 0:
                return None
            usage.add(rusage)
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
        if rel in inputs and sha256(content).digest() == inputs[rel]:
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


def regular_files(skipped=None):
    """The workspace's regular files, (relative path, path) sorted; what else is
    there goes to `skipped` (a reason), by default as an S frame."""
    if skipped is None:
        skipped = _skipped
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
                skipped(f"{rel!r}: file name is not UTF-8")
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth < MAX_DEPTH:
                    stack.append((entry.path, rel + "/", depth + 1))
            elif entry.is_file(follow_symlinks=False):
                found.append((rel, entry.path))
            else:
                skipped(f"{rel}: not a regular file")
    return sorted(found)


def _skipped(reason):
    send(b"S", reason.encode())


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


# Stand-ins for the rehearsal: a request header and a report with every kind of JSON
# value the real ones carry.
REHEARSAL_HEADER = (
    '{"nonce":"00","argv":["/bin/true","-I"],"env":{"A":"b"},"pipe_bytes":0,'
    '"fresh":false,"whole":true,"files":[["a/b",1]],"proxy_relay":null,"backstop_s":1.5}'
)
REHEARSAL_REPORT = {"nonce": "00", "wait_status": 0, "backstop": False, "disk_full": None}


def rehearse(wake_r):
    """Run once, on stand-ins, what a request runs: under gVisor the first call of
    each piece costs several times the next (parsing the first header 0.5-2 ms
    against ~0.1, the first workspace scan 0.5-5 ms against ~0.35: the Sentry maps
    the C code's pages and looks up paths for the first time), and that is better
    paid now, while the container waits, than on the request's path. Nothing of it
    is left behind (the stand-in files are removed), no frame is sent, and a part
    that fails is only a part not rehearsed."""
    json_loads(REHEARSAL_HEADER)
    json_dumps(REHEARSAL_REPORT).encode()
    struct.pack(">H", 0)
    sha256(b"").digest()
    first, second = os.path.join(CODE_DIR, ".rehearsal"), os.path.join(CODE_DIR, ".rehearsed")
    try:
        write_bytes(first, b"rehearsal", 0o444)
        os.rename(first, second)
        read_regular(second, CHUNK)
        os.chmod(CODE_DIR, stat.S_IMODE(os.stat(CODE_DIR).st_mode))
    except OSError:
        pass
    finally:
        for path in (first, second):
            try:
                os.unlink(path)
            except OSError:
                pass
    disk_full()
    regular_files(skipped=lambda reason: None)
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    poller.poll(0)
    poller.unregister(wake_r)
    Usage().add(resource.getrusage(resource.RUSAGE_SELF))
    time.monotonic()


PR_SET_DUMPABLE = 4
RTLD_NOW = 2


def not_dumpable():
    """Other processes of this uid may not ptrace this one or open its /proc entries
    (its descriptors carry the frames): the program runs as the same uid."""
    if _ctypes is not None and hasattr(_ctypes, "call_function"):
        prctl = _ctypes.dlsym(_ctypes.dlopen(None, RTLD_NOW), "prctl")
        failed = _ctypes.call_function(prctl, (PR_SET_DUMPABLE, 0, 0, 0, 0))
    else:  # pragma: no cover - the C half's private calls are gone
        import ctypes

        failed = ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if failed:
        # No sandbox whose supervisor the program could read: the container ends
        # before it says it is ready, and the engine's start reports the failure.
        raise SystemExit("execgate launcher: prctl(PR_SET_DUMPABLE, 0) failed")


def main():
    not_dumpable()
    warm = None
    serve_relay = stop_relay = None
    ahead = os.environ.get("EXECGATE_AHEAD")
    if ahead:
        ahead = json_loads(ahead)
        if ahead.get("proxy_relay"):
            # Bound before the program starts.
            serve_relay, stop_relay = start_relay(ahead["proxy_relay"])
        warm = start_ahead(ahead)
    wake_r = watch_children()
    rehearse(wake_r)
    send(b"R")
    try:
        size = struct.unpack(">I", read_exact(4))[0]
    except EOFError:
        return 0  # never used (the host went away): kill -1 ends the interpreter
    request = json_loads(read_exact(size).decode("utf-8"))
    try:
        if warm is not None and request.get("fresh") and not warm.exited:
            # The host would rather have this code read from the file by an
            # interpreter started now (bash reads a pipe one byte per call).
            os.kill(warm.pid, signal.SIGKILL)
            os.waitpid(warm.pid, 0)  # not the program: not in its usage
            warm.exited = True
            warm.close_pipes()
        code_path, inputs = receive_files(request, warm)
        code_feed = hand_over(warm) if warm is not None else (-1, -1)
    except (OSError, ValueError) as exc:
        full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        problem = "the code and input files do not fit in the disk limit" if full else str(exc)
        send(b"X", json_dumps({"nonce": request["nonce"], "setup_error": problem}).encode())
        return 125
    if warm is not None and not warm.exited:
        pid, stdin_w, out_r, err_r = warm.pid, warm.stdin_w, warm.out_r, warm.err_r
    else:
        if request.get("proxy_relay") and serve_relay is None:
            serve_relay, stop_relay = start_relay(request["proxy_relay"])
        pid, stdin_w, out_r, err_r = start_program(request, code_path)
    if serve_relay is not None:
        serve_relay()  # threads: only now, with no fork to follow
    usage = Usage()
    status, backstop = supervise(
        request, usage, wake_r, request["stdin_bytes"], stdin_w, out_r, err_r, pid, code_feed
    )
    if stop_relay is not None:
        stop_relay()  # the program's processes are all dead: nothing more of theirs leaves
    full = disk_full()
    send_files(request, inputs)
    report = {
        "nonce": request["nonce"],
        "wait_status": status,
        "backstop": backstop,
        "disk_full": full,
        "cpu_ms": int(usage.cpu_s * 1000),
        "max_rss_kb": usage.max_rss_kb,
    }
    send(b"X", json_dumps(report).encode())
    if status is None:
        return 137
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
