// Clang thread-safety annotations (-Wthread-safety), in the style of
// LevelDB's port/thread_annotations.h and Abseil's. They expand to nothing on
// compilers without the analysis (GCC), so the annotated code builds
// everywhere and `.ci/run` checks it with clang.
//
//   Mutex mu_;
//   int64_t total_ GUARDED_BY(mu_);
//   void AddLocked(int64_t n) REQUIRES(mu_);
//   int64_t total() const EXCLUDES(mu_);
//
// https://clang.llvm.org/docs/ThreadSafetyAnalysis.html
//
// Abseil (included through gRPC) defines the same macro names with the same
// meaning, so each is defined only if not defined already.
#pragma once

#if defined(__clang__)
#define MESHNET_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MESHNET_THREAD_ANNOTATION(x)
#endif

#ifndef CAPABILITY
#define CAPABILITY(x) MESHNET_THREAD_ANNOTATION(capability(x))
#endif
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY MESHNET_THREAD_ANNOTATION(scoped_lockable)
#endif
#ifndef GUARDED_BY
#define GUARDED_BY(x) MESHNET_THREAD_ANNOTATION(guarded_by(x))
#endif
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) MESHNET_THREAD_ANNOTATION(pt_guarded_by(x))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) MESHNET_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#endif
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) MESHNET_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#endif
#ifndef REQUIRES
#define REQUIRES(...) MESHNET_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#endif
#ifndef ACQUIRE
#define ACQUIRE(...) MESHNET_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) MESHNET_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#endif
#ifndef TRY_ACQUIRE
#define TRY_ACQUIRE(...) MESHNET_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#endif
#ifndef EXCLUDES
#define EXCLUDES(...) MESHNET_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#endif
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) MESHNET_THREAD_ANNOTATION(assert_capability(x))
#endif
#ifndef RETURN_CAPABILITY
#define RETURN_CAPABILITY(x) MESHNET_THREAD_ANNOTATION(lock_returned(x))
#endif
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS MESHNET_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif
