/* Linked into execgate's static nsjail ahead of the C library: ids are numbers only.
 *
 * nsjail resolves each --user/--group id with getpwnam()/getgrnam() before reading it
 * as a number. In a static binary that lookup dlopen()s the host's NSS modules (glibc's
 * own, of the version it was linked with, and systemd's, which talks to a socket) inside
 * the process that is about to build a jail, for every sandbox: ~0.4 ms of its ~5 ms.
 * execgate renders every id as a number, and a host account whose *name* is a number
 * ("200000") would otherwise win over the number itself. Defining both here keeps the
 * C library's versions (and NSS) out of the link, so no name is ever looked up. */
#include <errno.h>
#include <grp.h>
#include <pwd.h>

struct passwd *getpwnam(const char *name) {
	(void)name;
	errno = 0; /* "not found", as for an unknown name */
	return 0;
}

struct group *getgrnam(const char *name) {
	(void)name;
	errno = 0;
	return 0;
}
