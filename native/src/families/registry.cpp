// cairn kernel: every model family of this build (cairn/family.h), for the snapshot reader's
// family check. A new family adds its table here.
#include "cairn/family.h"

namespace cairn {

namespace qwen35 {
extern const FamilyOps kOps;  // families/qwen35/state.cpp
}

const FamilyOps* const kFamilies[] = {&kDsv4Ops, &qwen35::kOps, nullptr};

}  // namespace cairn
