/*
 * execgate-shim: put this process into a sandbox's network namespace and cgroups,
 * then exec nsjail, so that nsjail and everything it starts are inside both from
 * their first instruction (a process moved after it started could fork first).
 *
 *   execgate-shim [--netns FD] CGROUP_PROCS_FILE... -- PROGRAM [ARG...]
 *
 * FD is an inherited descriptor of the namespace (closed once joined); each
 * CGROUP_PROCS_FILE (cgroup.procs, v1 or v2) gets "0", which moves the writer.
 * Built static by deploy/nsjail/build.sh beside nsjail. It replaces a `/bin/sh -c`
 * script and a thread of the gateway's that joined the namespace before the fork:
 * ~1 ms of CPU per sandbox less (backends/nsjail/sandbox.py). On any failure it
 * exits SHIM_FAILED (125) with one line on stderr, before nsjail has run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHIM_FAILED 125

extern char **environ;

static int fail(const char *what, const char *arg) {
  dprintf(2, "execgate: cannot %s %s: %s\n", what, arg, strerror(errno));
  return SHIM_FAILED;
}

int main(int argc, char **argv) {
  int i = 1;
  if (i < argc && strcmp(argv[i], "--netns") == 0) {
    if (i + 1 >= argc) {
      errno = EINVAL;
      return fail("join the network namespace", "(no descriptor)");
    }
    char *end = NULL;
    errno = 0;
    long fd = strtol(argv[i + 1], &end, 10);
    if (errno != 0 || end == argv[i + 1] || *end != '\0' || fd < 0 || fd > INT_MAX) {
      errno = EINVAL;
      return fail("join the network namespace", argv[i + 1]);
    }
    if (setns((int)fd, CLONE_NEWNET) != 0) {
      return fail("join the network namespace", argv[i + 1]);
    }
    close((int)fd);
    i += 2;
  }
  for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      return fail("join cgroup", argv[i]);
    }
    ssize_t written = write(fd, "0\n", 2);
    if (written != 2) {
      int saved = written < 0 ? errno : EIO;
      close(fd);
      errno = saved;
      return fail("join cgroup", argv[i]);
    }
    close(fd);
  }
  if (i + 1 >= argc) {
    errno = EINVAL;
    return fail("run", "(no program after --)");
  }
  execve(argv[i + 1], &argv[i + 1], environ);
  return fail("run", argv[i + 1]);
}
