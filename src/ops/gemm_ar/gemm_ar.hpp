// src/ops/gemm_ar/gemm_ar.hpp — what GEMM+AllReduce's strategies share
// (gemm_ar.cpp). Each strategy's launcher is in its own file here and
// registered in gemm_ar.cpp. Internal to src/ops.
#pragma once

#include "../gemm_rs/gemm_rs.hpp"

namespace tessera::ops::ar {

/// gemm_ar's operands as the row-parallel GEMM's (gemm_rs), which the
/// shared GEMM helper and fused_ce's kernel take, with the fused tile's plan.
/// rs.d / rs.m_local: this rank's rows of D.
struct RowParallel {
  RsPlan plan;
  GemmRsArgs rs;
};
RowParallel row_parallel(const TpContext::Impl& c, const GemmArArgs& a);

/// The sequential strategy's GEMM and all-reduce (sequential.cpp; fused_ce
/// runs it at R = 1).
void run_sequential(TpContext::Impl& c, const GemmArArgs& a, const GemmRsArgs& rs);

/// The strategies (one file each).
extern const TpStrategy<GemmArArgs> sequential;
extern const TpStrategy<GemmArArgs> fused_ce;

}  // namespace tessera::ops::ar
