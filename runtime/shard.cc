#include "runtime/shard.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace meshrun::runtime {

absl::StatusOr<HostArray> ShardOf(const HostArray& global, const std::vector<std::string>& sharding,
                                  const std::vector<std::string>& mesh_axes,
                                  const std::vector<int64_t>& mesh_shape, int partition) {
  const std::vector<int64_t>& dims = global.shape.dims;
  // Partition p sits at the row-major coordinate p of the mesh.
  std::vector<int64_t> coord(mesh_shape.size());
  for (int a = static_cast<int>(mesh_shape.size()) - 1, p = partition; a >= 0; --a) {
    coord[a] = p % mesh_shape[a];
    p /= static_cast<int>(mesh_shape[a]);
  }
  std::vector<int64_t> start(dims.size(), 0), size = dims;
  for (size_t i = 0; i < dims.size() && i < sharding.size(); ++i) {
    if (sharding[i].empty()) continue;
    size_t a = 0;
    while (a < mesh_axes.size() && mesh_axes[a] != sharding[i]) ++a;
    if (a == mesh_axes.size()) {
      return absl::InvalidArgumentError("unknown mesh axis '" + sharding[i] + "'");
    }
    if (dims[i] % mesh_shape[a] != 0) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", i, " of ", ToString(global.shape),
                                                     " does not split ", mesh_shape[a], " ways"));
    }
    size[i] = dims[i] / mesh_shape[a];
    start[i] = coord[a] * size[i];
  }
  const int64_t element = DTypeByteSize(global.shape.dtype);
  HostArray out{{global.shape.dtype, size}, {}};
  out.bytes.resize(static_cast<size_t>(out.shape.ByteSize()));
  // Copy the block row by row along the last dimension.
  const size_t rank = dims.size();
  const int64_t row = rank == 0 ? 1 : size[rank - 1];
  std::vector<int64_t> index(rank, 0);
  for (int64_t dst = 0; dst < out.shape.NumElements(); dst += row) {
    int64_t src = 0;
    for (size_t i = 0; i < rank; ++i) src = src * dims[i] + start[i] + index[i];
    std::memcpy(out.bytes.data() + dst * element, global.bytes.data() + src * element,
                static_cast<size_t>(row * element));
    for (int i = static_cast<int>(rank) - 2; i >= 0; --i) {  // next row
      if (++index[i] < size[i]) break;
      index[i] = 0;
    }
  }
  return out;
}

}  // namespace meshrun::runtime
