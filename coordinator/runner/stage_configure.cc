#include "coordinator/runner/stage_configure.h"

#include "common/model/transformer_config.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

pb::OptimizerConfig OptimizerFromSpec(const pb::TrainingSpec& t) {
  pb::OptimizerConfig o;
  o.set_lr(t.lr());
  o.set_beta1(t.beta1());
  o.set_beta2(t.beta2());
  o.set_eps(1e-8f);
  o.set_weight_decay(t.weight_decay());
  o.set_grad_clip_norm(t.grad_clip_norm());
  return o;
}

pb::ConfigureRequest BuildConfigureRequest(const planner::Plan& plan, int stage, uint64_t seed,
                                           const pb::OptimizerConfig& optimizer,
                                           const StageWiring& wiring) {
  const int K = static_cast<int>(plan.stages.size());
  pb::ConfigureRequest r;
  r.set_job_id(wiring.job_id);
  r.set_stage(stage);
  r.set_num_stages(K);
  *r.mutable_model() = model::ConfigToProto(plan.options.model);
  const auto& layers = plan.stages[stage].chunks;
  for (size_t c = 0; c < layers.size(); ++c) {
    pb::LayerRange* range = r.add_chunks();
    range->set_chunk(static_cast<int>(c));
    range->set_begin_layer(layers[c].first);
    range->set_end_layer(layers[c].second);
  }
  r.set_seed(seed);
  *r.mutable_optimizer() = optimizer;
  if (K > 1) {
    r.set_upstream_address(wiring.addresses[(stage + K - 1) % K]);
    r.set_downstream_address(wiring.addresses[(stage + 1) % K]);
  }
  for (bool recompute : plan.stages[stage].chunk_recompute) r.add_chunk_recompute(recompute);
  r.set_precision(plan.options.precision);
  r.set_placement(plan.topology().placement == schedule::Placement::kV ? pb::PLACEMENT_V
                                                                      : pb::PLACEMENT_LOOPED);
  r.set_micro_batch_size(plan.options.replica_batch_size() / plan.options.micro_batches);
  r.set_peer_secret(wiring.peer_secret);
  r.set_recv_deadline_ms(wiring.recv_deadline_ms);
  if (plan.options.snapshots) {
    // The ring successor holds this stage's copy; with one stage it is kept here only.
    if (K > 1) r.set_snapshot_peer_address(wiring.addresses[(stage + 1) % K]);
    r.set_snapshot_reserve_bytes(static_cast<uint64_t>(plan.stages[stage].snapshot_bytes));
  }
  return r;
}

}  // namespace pipetrain::coordinator
