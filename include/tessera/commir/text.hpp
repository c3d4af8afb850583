// tessera/commir/text.hpp — the textual form of a Grid. parse(print(g)) == g.
//
//   grid attn {
//     mesh 2x4
//     dtype bf16
//     axis q = 4096 spatial
//     axis kv = 4096 reduction
//     buffer K[b, h/4, kv] : 128 read
//     body O = attend(Q, K, V)          | C += A * B | Y = X1 + X2
//     kernel attention                   (after patch)
//     tile q 2 4                         (factor extents by level)
//     loop q0 = q#0 parallel 0           (nest order = line order)
//     loop kv0 = kv#0 shift q0
//     loop hq = h#0 * q#1                (joined)
//     shard K q0 along kv0 loop          | shard Q h0 along q axis | replicate V q1
//   }
// '#' starts a comment. Errors name the line and what was expected. parse()
// rejects texts over kMaxTextBytes, numbers over 2^40, repeated mesh / dtype /
// body / kernel / tile-of-one-axis statements, and then checks the grid with
// validate() (ir.hpp): every error is a tessera::Error.
#pragma once

#include <string>

#include "tessera/commir/ir.hpp"

namespace tessera::commir {

inline constexpr std::size_t kMaxTextBytes = std::size_t{1} << 20;

std::string print(const Grid& g);
Grid parse(const std::string& text);

}  // namespace tessera::commir
