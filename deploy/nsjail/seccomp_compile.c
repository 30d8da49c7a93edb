/* execgate-seccomp-compile POLICY OUT: compile a kafel seccomp policy once, as nsjail
 * would for every sandbox, and write it where nsjail (patched by compiled_policy.patch)
 * loads it instead of compiling it again: kafel cost ~1.2 ms of nsjail's ~3.7 ms of CPU
 * per sandbox here, for the same filter each time.
 *
 * OUT is EXECGATE_COMPILED_MAGIC and then the filter's instructions, as kafel built them
 * (the same library, the same calls as nsjail's sandbox.cc: default target architecture,
 * input from the file), written to OUT.tmp and renamed over OUT. Exit 0 when written;
 * 1 with the reason on stderr otherwise (kafel's own message for a bad policy). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kafel.h"

#define EXECGATE_COMPILED_MAGIC "EXECGATE-SECCOMP-BPF/1\n"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s POLICY OUT\n", argv[0]);
    return 1;
  }
  FILE* in = fopen(argv[1], "r");
  if (!in) {
    fprintf(stderr, "execgate-seccomp-compile: %s: %s\n", argv[1], strerror(errno));
    return 1;
  }
  kafel_ctxt_t ctxt = kafel_ctxt_create();
  kafel_set_input_file(ctxt, in);
  struct sock_fprog prog = {0, NULL};
  if (kafel_compile(ctxt, &prog) != 0) {
    fprintf(stderr, "execgate-seccomp-compile: %s: %s\n", argv[1], kafel_error_msg(ctxt));
    kafel_ctxt_destroy(&ctxt);
    fclose(in);
    return 1;
  }
  kafel_ctxt_destroy(&ctxt);
  fclose(in);
  if (prog.len == 0 || prog.len > BPF_MAXINSNS) {
    fprintf(stderr, "execgate-seccomp-compile: %s: %u instructions\n", argv[1], prog.len);
    return 1;
  }
  size_t n = strlen(argv[2]) + sizeof(".tmp");
  char* tmp = malloc(n);
  if (!tmp) {
    return 1;
  }
  snprintf(tmp, n, "%s.tmp", argv[2]);
  FILE* out = fopen(tmp, "w");
  int ok = out != NULL &&
           fwrite(EXECGATE_COMPILED_MAGIC, 1, strlen(EXECGATE_COMPILED_MAGIC), out) ==
               strlen(EXECGATE_COMPILED_MAGIC) &&
           fwrite(prog.filter, sizeof(struct sock_filter), prog.len, out) == prog.len;
  if (out != NULL && fclose(out) != 0) {
    ok = 0;
  }
  if (!ok || rename(tmp, argv[2]) != 0) {
    fprintf(stderr, "execgate-seccomp-compile: %s: %s\n", argv[2], strerror(errno));
    unlink(tmp);
    return 1;
  }
  free(prog.filter);
  free(tmp);
  return 0;
}
