#include "core/fused_post_ops.h"

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln {

std::vector<PostOp> readPostOps(const std::string& op, const ParamMap& params) {
  const std::string kinds = params.getString("post_ops", "");
  std::vector<PostOp> list;
  if (kinds.empty()) return list;
  const std::vector<double> alphas = params.getFloats("post_op_alpha", {});
  const std::vector<double> betas = params.getFloats("post_op_beta", {});
  for (size_t start = 0, index = 0; start <= kinds.size(); ++index) {
    const size_t end = std::min(kinds.find(',', start), kinds.size());
    const std::string kind = kinds.substr(start, end - start);
    start = end + 1;
    PostOp post;
    if (kind == "Add") {
      post.add = true;
    } else {
      const std::optional<FusedActivation> activation = parseFusedActivation(kind);
      if (!activation || *activation == FusedActivation::kNone) {
        throw UsageError(fmt::format("{}: unknown post-op '{}' in post_ops '{}'", op, kind, kinds));
      }
      post.activation = *activation;
      post.alpha = static_cast<float>(index < alphas.size() ? alphas[index] : 0.0);
      post.beta = static_cast<float>(index < betas.size() ? betas[index] : 0.0);
    }
    list.push_back(post);
  }
  return list;
}

}  // namespace kiln
