// detect_launch_info(): each launcher convention, their precedence, the
// rendezvous fallbacks, and an error naming the variable for every malformed
// or partial environment. Also default_bootstrap_timeout().
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "tessera/runtime/bootstrap.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/launch.hpp"

namespace {

using tessera::runtime::detect_launch_info;
using tessera::runtime::LaunchInfo;

// Every variable detect_launch_info() or the timeout reads.
const char* const kVars[] = {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "PMIX_NAMESPACE",
                             "OMPI_MCA_ess_base_jobid",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "SLURM_NTASKS_PER_NODE",
                             "SLURM_STEP_TASKS_PER_NODE",
                             "SLURM_TASKS_PER_NODE",
                             "SLURM_NODEID",
                             "SLURM_NNODES",
                             "SLURM_STEP_NODELIST",
                             "SLURM_JOB_NODELIST",
                             "SLURM_NODELIST",
                             "SLURM_JOB_ID",
                             "TESSERA_BOOTSTRAP_TIMEOUT_MS",
                             "TESSERA_JOB_SECRET",
                             "TORCHELASTIC_RUN_ID",
                             "SLURM_STEP_ID"};

/// Clears every launch variable for the test and restores them afterwards
/// (the tests may themselves run under torchrun, SLURM or `tessera run`).
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* s = std::getenv(v)) saved_[v] = s;
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kVars) {
      ::unsetenv(v);
      if (auto it = saved_.find(v); it != saved_.end()) ::setenv(v, it->second.c_str(), 1);
    }
  }
  void set(std::initializer_list<std::pair<const char*, const char*>> kv) {
    for (auto [k, v] : kv) ::setenv(k, v, 1);
  }
  /// The error message of detect_launch_info(), or nullopt if it succeeded.
  std::optional<std::string> error() {
    try {
      (void)detect_launch_info();
    } catch (const tessera::Error& e) {
      return std::string(e.what());
    }
    return std::nullopt;
  }

 private:
  std::map<std::string, std::string> saved_;
};

#define EXPECT_ERROR_NAMES(...)                                                                        \
  do {                                                                                                 \
    const auto msg_ = error();                                                                         \
    ASSERT_TRUE(msg_.has_value()) << "expected a tessera::Error";                                      \
    for (const char* part_ : {__VA_ARGS__})                                                            \
      EXPECT_NE(msg_->find(part_), std::string::npos) << "message lacks '" << part_ << "': " << *msg_; \
  } while (0)

TEST_F(LaunchEnv, NothingSetIsASingleProcess) {
  const LaunchInfo li = detect_launch_info();
  EXPECT_EQ(li.source, "single");
  EXPECT_EQ(li.rank, 0);
  EXPECT_EQ(li.world, 1);
  EXPECT_EQ(li.local_rank, 0);
  EXPECT_EQ(li.local_world, 1);
}

TEST_F(LaunchEnv, Torchrun) {
  set({{"RANK", "6"},
       {"WORLD_SIZE", "8"},
       {"LOCAL_RANK", "2"},
       {"LOCAL_WORLD_SIZE", "4"},
       {"MASTER_ADDR", "node17"},
       {"MASTER_PORT", "29500"}});
  const LaunchInfo li = detect_launch_info();
  EXPECT_EQ(li.source, "torchrun");
  EXPECT_EQ(li.rank, 6);
  EXPECT_EQ(li.world, 8);
  EXPECT_EQ(li.local_rank, 2);
  EXPECT_EQ(li.local_world, 4);
  EXPECT_EQ(li.master_addr, "node17");
  EXPECT_EQ(li.master_port, 29500);
}

TEST_F(LaunchEnv, TorchrunWithoutLocalVariablesMeansOneNode) {
  set({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}});
  const LaunchInfo li = detect_launch_info();
  EXPECT_EQ(li.local_rank, 3);
  EXPECT_EQ(li.local_world, 4);
}

TEST_F(LaunchEnv, TorchrunWorldOfOneNeedsNoRendezvous) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  const LaunchInfo li = detect_launch_info();
  EXPECT_EQ(li.world, 1);
  EXPECT_EQ(li.source, "torchrun");
}

TEST_F(LaunchEnv, TorchrunWinsOverOpenMpiWhichWinsOverSlurm) {
  set({{"SLURM_PROCID", "1"},
       {"SLURM_NTASKS", "2"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_NNODES", "1"},
       {"OMPI_COMM_WORLD_RANK", "2"},
       {"OMPI_COMM_WORLD_SIZE", "3"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
       {"MASTER_ADDR", "h"},
       {"MASTER_PORT", "5000"}});
  EXPECT_EQ(detect_launch_info().source, "openmpi");
  EXPECT_EQ(detect_launch_info().rank, 2);
  set({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(detect_launch_info().source, "torchrun");
  EXPECT_EQ(detect_launch_info().rank, 3);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(detect_launch_info().source, "slurm");
  EXPECT_EQ(detect_launch_info().rank, 1);
}

TEST_F(LaunchEnv, SlurmMultiNodeFallsBackToFirstHostAndJobIdPort) {
  set({{"SLURM_PROCID", "5"},
       {"SLURM_NTASKS", "8"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_TASKS_PER_NODE", "4(x2)"},
       {"SLURM_NODEID", "1"},
       {"SLURM_NNODES", "2"},
       {"SLURM_JOB_NODELIST", "gpu[07-08],login3"},
       {"SLURM_JOB_ID", "12345"}});
  LaunchInfo li = detect_launch_info();
  EXPECT_EQ(li.source, "slurm");
  EXPECT_EQ(li.rank, 5);
  EXPECT_EQ(li.world, 8);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.local_world, 4);
  EXPECT_EQ(li.master_addr, "gpu07");
  EXPECT_EQ(li.master_port, 20000 + 12345 % 20000);
  // The step's node list is preferred; MASTER_ADDR/MASTER_PORT override both.
  set({{"SLURM_STEP_NODELIST", "a12,b3"}});
  EXPECT_EQ(detect_launch_info().master_addr, "a12");
  set({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "4242"}});
  li = detect_launch_info();
  EXPECT_EQ(li.master_addr, "10.0.0.1");
  EXPECT_EQ(li.master_port, 4242);
}

TEST_F(LaunchEnv, SlurmTasksPerNodeSources) {
  set({{"SLURM_PROCID", "6"},
       {"SLURM_NTASKS", "7"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_NODEID", "2"},
       {"SLURM_STEP_TASKS_PER_NODE", "3,2(x2)"},
       {"SLURM_TASKS_PER_NODE", "4(x2)"},
       {"MASTER_ADDR", "h"},
       {"MASTER_PORT", "5000"}});
  EXPECT_EQ(detect_launch_info().local_world, 2);  // the step's list wins over the job's
  set({{"SLURM_NTASKS_PER_NODE", "3"}});
  EXPECT_EQ(detect_launch_info().local_world, 3);  // an explicit request wins over both
}

TEST_F(LaunchEnv, SlurmSingleNodeUsesLoopback) {
  set({{"SLURM_PROCID", "1"},
       {"SLURM_NTASKS", "2"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_NNODES", "1"},
       {"SLURM_JOB_ID", "77"}});
  const LaunchInfo li = detect_launch_info();
  EXPECT_EQ(li.master_addr, "127.0.0.1");
  EXPECT_EQ(li.master_port, 20077);
  EXPECT_EQ(li.local_world, 2);
}

TEST_F(LaunchEnv, OpenMpi) {
  set({{"OMPI_COMM_WORLD_RANK", "3"},
       {"OMPI_COMM_WORLD_SIZE", "4"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
       {"MASTER_ADDR", "n1"},
       {"MASTER_PORT", "6000"}});
  const LaunchInfo li = detect_launch_info();
  EXPECT_EQ(li.source, "openmpi");
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.world, 4);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.local_world, 2);
  EXPECT_EQ(li.master_addr, "n1");
  EXPECT_EQ(li.master_port, 6000);
}

TEST_F(LaunchEnv, OpenMpiSingleNodeDerivesTheRendezvous) {
  set({{"OMPI_COMM_WORLD_RANK", "1"},
       {"OMPI_COMM_WORLD_SIZE", "2"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
       {"PMIX_NAMESPACE", "prterun-host-4711@1"}});
  const LaunchInfo a = detect_launch_info();
  EXPECT_EQ(a.master_addr, "127.0.0.1");
  EXPECT_GE(a.master_port, 20000);
  EXPECT_LT(a.master_port, 40000);
  EXPECT_EQ(detect_launch_info().master_port, a.master_port);  // every rank derives the same port
  set({{"PMIX_NAMESPACE", "prterun-host-4712@1"}});
  EXPECT_NE(detect_launch_info().master_port, a.master_port);  // another job, (almost surely) another port
}

// ---- malformed / partial environments -----------------------------------------

TEST_F(LaunchEnv, RankWithoutWorldSize) {
  set({{"RANK", "1"}});
  EXPECT_ERROR_NAMES("RANK", "WORLD_SIZE");
}

TEST_F(LaunchEnv, WorldSizeWithoutRank) {
  set({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  EXPECT_ERROR_NAMES("RANK is not");
}

TEST_F(LaunchEnv, LocalRankAlone) {
  set({{"LOCAL_RANK", "0"}});
  EXPECT_ERROR_NAMES("LOCAL_RANK", "WORLD_SIZE");
}

TEST_F(LaunchEnv, LocalRankWithoutLocalWorldSize) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  EXPECT_ERROR_NAMES("LOCAL_WORLD_SIZE");
}

TEST_F(LaunchEnv, RankOutOfRange) {
  set({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  EXPECT_ERROR_NAMES("RANK = 4", "WORLD_SIZE = 4");
  set({{"RANK", "-1"}});
  EXPECT_ERROR_NAMES("RANK = -1");
}

TEST_F(LaunchEnv, WorldSizeNotPositive) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
  EXPECT_ERROR_NAMES("WORLD_SIZE = 0");
  set({{"WORLD_SIZE", "-3"}});
  EXPECT_ERROR_NAMES("WORLD_SIZE = -3");
}

TEST_F(LaunchEnv, NotAnInteger) {
  set({{"RANK", "abc"}, {"WORLD_SIZE", "2"}});
  EXPECT_ERROR_NAMES("RANK = 'abc'");
  set({{"RANK", "1x"}});
  EXPECT_ERROR_NAMES("RANK = '1x'");
  set({{"RANK", ""}});
  EXPECT_ERROR_NAMES("RANK = ''");
  set({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}});
  EXPECT_ERROR_NAMES("WORLD_SIZE");
}

TEST_F(LaunchEnv, LocalRankOutOfRange) {
  set({{"RANK", "1"},
       {"WORLD_SIZE", "4"},
       {"LOCAL_RANK", "2"},
       {"LOCAL_WORLD_SIZE", "2"},
       {"MASTER_ADDR", "h"},
       {"MASTER_PORT", "1"}});
  EXPECT_ERROR_NAMES("LOCAL_RANK = 2", "LOCAL_WORLD_SIZE = 2");
  set({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "5"}});
  EXPECT_ERROR_NAMES("LOCAL_WORLD_SIZE = 5");
}

TEST_F(LaunchEnv, BadPort) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
  for (const char* p : {"0", "65536", "http", "-5", ""}) {
    set({{"MASTER_PORT", p}});
    EXPECT_ERROR_NAMES("MASTER_PORT");
  }
  // Malformed is an error even when world == 1 would not need it.
  set({{"WORLD_SIZE", "1"}, {"MASTER_PORT", "x"}});
  EXPECT_ERROR_NAMES("MASTER_PORT = 'x'");
}

TEST_F(LaunchEnv, MissingRendezvousWhenWorldAboveOne) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1000"}});
  EXPECT_ERROR_NAMES("MASTER_ADDR");
  set({{"MASTER_ADDR", ""}});
  EXPECT_ERROR_NAMES("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  set({{"MASTER_ADDR", "h"}});
  EXPECT_ERROR_NAMES("MASTER_PORT");
}

TEST_F(LaunchEnv, SlurmPartial) {
  set({{"SLURM_PROCID", "0"}});
  EXPECT_ERROR_NAMES("SLURM_NTASKS");
  set({{"SLURM_NTASKS", "2"}});
  EXPECT_ERROR_NAMES("SLURM_LOCALID");
  set({{"SLURM_LOCALID", "0"}, {"SLURM_PROCID", "2"}});
  EXPECT_ERROR_NAMES("SLURM_PROCID = 2", "SLURM_NTASKS = 2");
}

TEST_F(LaunchEnv, SlurmBadTasksPerNode) {
  set({{"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "4"},
       {"SLURM_LOCALID", "0"},
       {"MASTER_ADDR", "h"},
       {"MASTER_PORT", "1"}});
  set({{"SLURM_TASKS_PER_NODE", "2(x"}});
  EXPECT_ERROR_NAMES("SLURM_TASKS_PER_NODE");
  set({{"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_NODEID", "2"}});
  EXPECT_ERROR_NAMES("SLURM_TASKS_PER_NODE", "SLURM_NODEID = 2");
  set({{"SLURM_TASKS_PER_NODE", "zero"}, {"SLURM_NODEID", "0"}});
  EXPECT_ERROR_NAMES("SLURM_TASKS_PER_NODE = 'zero'");
}

TEST_F(LaunchEnv, SlurmMultiNodeWithoutAnyRendezvous) {
  set({{"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "4"},
       {"SLURM_LOCALID", "0"},
       {"SLURM_NTASKS_PER_NODE", "2"},
       {"SLURM_NNODES", "2"}});
  EXPECT_ERROR_NAMES("MASTER_ADDR");
  set({{"SLURM_JOB_NODELIST", "n[1-2]"}});
  EXPECT_ERROR_NAMES("MASTER_PORT");
}

TEST_F(LaunchEnv, OpenMpiPartialOrInconsistent) {
  set({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_ERROR_NAMES("OMPI_COMM_WORLD_LOCAL_RANK");
  set({{"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  EXPECT_ERROR_NAMES("OMPI_COMM_WORLD_LOCAL_SIZE");
  set({{"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});  // multi-node, no MASTER_ADDR
  EXPECT_ERROR_NAMES("MASTER_ADDR");
  set({{"OMPI_COMM_WORLD_RANK", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  EXPECT_ERROR_NAMES("OMPI_COMM_WORLD_RANK = 2", "OMPI_COMM_WORLD_SIZE = 2");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_ERROR_NAMES("OMPI_COMM_WORLD_RANK");
}

TEST_F(LaunchEnv, JobSecretFromTheEnvironmentOrDerivedAndSaidSo) {
  set({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  LaunchInfo li = detect_launch_info();
  EXPECT_TRUE(li.secret_derived);
  EXPECT_FALSE(li.job_secret.empty());
  EXPECT_NE(li.secret_source.find("not a secret"), std::string::npos) << li.secret_source;
  set({{"TORCHELASTIC_RUN_ID", "job-17"}});
  const LaunchInfo with_id = detect_launch_info();
  EXPECT_NE(with_id.job_secret, li.job_secret) << "the run id must be part of the derived key";
  EXPECT_NE(with_id.secret_source.find("TORCHELASTIC_RUN_ID"), std::string::npos) << with_id.secret_source;

  set({{"TESSERA_JOB_SECRET", "0123456789abcdef0123456789abcdef"}});
  li = detect_launch_info();
  EXPECT_FALSE(li.secret_derived);
  EXPECT_EQ(li.job_secret, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(li.secret_source, "TESSERA_JOB_SECRET");

  set({{"TESSERA_JOB_SECRET", "short"}});
  EXPECT_ERROR_NAMES("TESSERA_JOB_SECRET", "at least 16");
}

TEST_F(LaunchEnv, SlurmJobSecretIsDerivedFromTheJobAndStep) {
  set({{"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "2"},
       {"SLURM_LOCALID", "0"},
       {"SLURM_NNODES", "1"},
       {"SLURM_JOB_ID", "4242"},
       {"SLURM_STEP_ID", "0"}});
  const LaunchInfo a = detect_launch_info();
  set({{"SLURM_STEP_ID", "1"}});
  const LaunchInfo b = detect_launch_info();
  EXPECT_TRUE(a.secret_derived);
  EXPECT_NE(a.job_secret, b.job_secret) << "two steps of one job must not share a key";
}

TEST_F(LaunchEnv, SingleProcessHasNoSecret) { EXPECT_TRUE(detect_launch_info().job_secret.empty()); }

TEST_F(LaunchEnv, BootstrapTimeoutFromEnvironment) {
  using std::chrono::milliseconds;
  EXPECT_EQ(tessera::runtime::default_bootstrap_timeout(), milliseconds(60000));
  set({{"TESSERA_BOOTSTRAP_TIMEOUT_MS", "250"}});
  EXPECT_EQ(tessera::runtime::default_bootstrap_timeout(), milliseconds(250));
  for (const char* bad : {"0", "-1", "soon", ""}) {
    set({{"TESSERA_BOOTSTRAP_TIMEOUT_MS", bad}});
    try {
      (void)tessera::runtime::default_bootstrap_timeout();
      ADD_FAILURE() << "accepted TESSERA_BOOTSTRAP_TIMEOUT_MS=" << bad;
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find("TESSERA_BOOTSTRAP_TIMEOUT_MS"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
