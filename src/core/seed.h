// Deterministic seed derivation: every random stream in FusionRL is seeded
// from the job seed and a position (step, index, stream tag), so runs are
// reproducible and resumable without saving RNG state.
#ifndef FUSIONRL_CORE_SEED_H_
#define FUSIONRL_CORE_SEED_H_

#include <cstdint>

namespace fusionrl {

// splitmix64 finaliser over (a, b): well-mixed, cheap, stable across
// platforms.
inline uint64_t MixSeed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9E3779B97F4A7C15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_SEED_H_
