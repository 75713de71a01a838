// For the children that tests fork (meshnet nodes, CLI runs, etcd): a child
// that must not outlive the process that started it.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

namespace meshnet {

// Call in the child right after fork(), `parent` being getpid() taken before
// the fork. The child gets SIGKILL when the forking thread ends (a test that
// crashes or that ctest kills at its timeout leaves no child running), so fork
// on a thread that outlives the child (the test's main thread, or one that
// waits for the child's exit). Exits 127 at once if the parent is already
// gone. Only system calls: safe between fork and exec in a threaded process.
inline void DieWithParent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
}

}  // namespace meshnet
