// Element-wise reduction primitive: dst[i] = op(dst[i], src[i]).
// Half types are widened to float, combined, and rounded back once, so the
// result of op(a, b) equals op(b, a) bit for bit (ranks that combine the same
// two values in either order agree).
#pragma once

#include <cstddef>
#include <string>

#include "common/types.h"

namespace tilecomm::kernels {

/// Empty string if `op` is defined on `dtype`, else the reason it is not.
std::string checkReducible(DType dtype, RedOp op);

/// dst = op(dst, src) over `count` elements. Requires checkReducible() == "".
void reduceInto(void* dst, const void* src, size_t count, DType dtype, RedOp op);

}  // namespace tilecomm::kernels
