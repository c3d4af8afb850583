// src/runtime/hmac.hpp — private: SHA-256 and HMAC-SHA-256 (FIPS 180-4,
// RFC 2104) for the bootstrap's challenge/response, a constant-time compare,
// and random bytes from the kernel (getrandom). No dependency beyond libc.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::runtime::crypto {

using Digest = std::array<std::uint8_t, 32>;

/// SHA-256 of `data`.
Digest sha256(std::string_view data);

/// HMAC-SHA-256 of `message` under `key` (any length).
Digest hmac_sha256(std::string_view key, std::string_view message);

/// True when the n bytes at a and b are equal; the time taken does not
/// depend on where they differ.
bool equal_constant_time(const void* a, const void* b, std::size_t n);

/// n bytes from getrandom() (blocks only before the kernel's pool is
/// initialised at boot). Throws tessera::Error if the kernel refuses.
void random_bytes(void* out, std::size_t n);

/// Lower-case hex of n bytes.
std::string to_hex(const void* data, std::size_t n);

}  // namespace tessera::runtime::crypto
