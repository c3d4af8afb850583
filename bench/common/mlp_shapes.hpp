// bench/common/mlp_shapes.hpp — the seed workloads' MLP shapes (TileLink
// Table 4; WORKLOADS.md): S = batch x seq, H hidden, I intermediate.
#pragma once

#include <cstdint>

#include "tessera/runtime/error.hpp"

namespace tessera::bench {

struct MlpShape {
  const char* name;
  std::int64_t s, h, i;
};

inline constexpr MlpShape kMlpShapes[] = {{"MLP-1", 8192, 4096, 11008}, {"MLP-2", 8192, 4096, 14336},
                                          {"MLP-3", 8192, 3584, 14336}, {"MLP-4", 8192, 4608, 36864},
                                          {"MLP-5", 8192, 8192, 28672}, {"MLP-6", 8192, 8192, 29568}};

/// MLP-`index` (1-based, as on the command line); an Error otherwise.
inline const MlpShape& mlp_shape(int index) {
  TESSERA_CHECK(index >= 1 && index <= 6, "--shapes: MLP-{} does not exist (1..6)", index);
  return kMlpShapes[index - 1];
}

}  // namespace tessera::bench
