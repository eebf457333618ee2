// LD_PRELOAD shim for diagnosing a SIGSEGV on a machine without gdb: prints the faulting
// address, the instruction pointer and the shared object (with the nearest symbol) it lies in,
// then the frames glibc's backtrace() can walk. Diagnostic only (scripts/device/cpp_errors.sh).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void where(const char* what, void* pc) {
  Dl_info info;
  memset(&info, 0, sizeof info);
  if (dladdr(pc, &info) && info.dli_fname) {
    fprintf(stderr, "[segv] %s %p in %s (+0x%lx) %s+0x%lx\n", what, pc, info.dli_fname,
            (unsigned long)((char*)pc - (char*)info.dli_fbase), info.dli_sname ? info.dli_sname : "?",
            info.dli_saddr ? (unsigned long)((char*)pc - (char*)info.dli_saddr) : 0ul);
  } else {
    fprintf(stderr, "[segv] %s %p (no object)\n", what, pc);
  }
}

static void handler(int sig, siginfo_t* si, void* ctx) {
  ucontext_t* uc = (ucontext_t*)ctx;
  void* pc = (void*)uc->uc_mcontext.gregs[REG_RIP];
  fprintf(stderr, "[segv] signal %d, fault address %p\n", sig, si->si_addr);
  where("pc", pc);
  void** sp = (void**)uc->uc_mcontext.gregs[REG_RSP];
  for (int i = 0; i < 64; ++i) {  // return-address candidates on the stack
    Dl_info info;
    if (dladdr(sp[i], &info) && info.dli_fname && info.dli_sname) where("stack", sp[i]);
  }
  fflush(stderr);
  _exit(139);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
}
