// tessera/runtime/dtype.hpp — element types Tessera's operators accept.
#pragma once

#include <cstddef>
#include <string_view>

namespace tessera {

enum class DType { bf16, f16, f32 };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::f32:
      return "f32";
  }
  return "?";
}

}  // namespace tessera
