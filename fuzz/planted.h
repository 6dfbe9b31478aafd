// fuzz/planted.h: the planted bug a fuzz target binary is built with (fuzz/README.md). The
// build defines KVGUARD_PLANTED_BUG as one bug's name for the planted variants of the
// isolation targets, and leaves it undefined for the real ones.
#ifndef KVGUARD_FUZZ_PLANTED_H_
#define KVGUARD_FUZZ_PLANTED_H_

namespace kvguard::fuzz {

#ifdef KVGUARD_PLANTED_BUG
inline constexpr const char* kPlantedBug = KVGUARD_PLANTED_BUG;
#else
inline constexpr const char* kPlantedBug = "";
#endif

}  // namespace kvguard::fuzz

#endif  // KVGUARD_FUZZ_PLANTED_H_
