// StopSignals: SIGINT/SIGTERM end the process at any time (before Arm and on
// a second signal), and the first armed signal reaches Wait().
#include "util/stop_signals.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

namespace meshnet {
namespace {

class StopSignalsDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// The main thread is busy (here: blocked forever, like a load from a FIFO);
// SIGTERM to the process still ends it.
TEST_F(StopSignalsDeathTest, SignalBeforeArmEndsTheProcess) {
  EXPECT_EXIT(
      {
        StopSignals stop;
        kill(getpid(), SIGTERM);  // process-directed, as `kill PID` is
        pause();                  // never returns: the waiter must exit us
        std::_Exit(3);
      },
      ::testing::ExitedWithCode(128 + SIGTERM), "SIGTERM before serving");
}

TEST_F(StopSignalsDeathTest, ArmedSignalReachesWaitAndASecondEndsTheProcess) {
  EXPECT_EXIT(
      {
        StopSignals stop;
        stop.Arm();
        kill(getpid(), SIGINT);
        if (stop.Wait() != SIGINT) std::_Exit(4);
        kill(getpid(), SIGTERM);  // e.g. a drain that takes too long
        pause();
        std::_Exit(5);
      },
      ::testing::ExitedWithCode(128 + SIGTERM), "SIGTERM again while stopping");
}

}  // namespace
}  // namespace meshnet
