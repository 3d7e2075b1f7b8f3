// cairn kernel: every model family of this build (cairn/family.h), for the snapshot reader's
// family check. A new family adds its table here.
#include "cairn/family.h"

namespace cairn {

const FamilyOps* const kFamilies[] = {&kDsv4Ops, nullptr};

}  // namespace cairn
