// The rotary angles: theta^(-2i/hs) per pair, and Llama 3.1's "llama3" scaling, which
// keeps short wavelengths, stretches long ones by the factor and blends those between.
#include "common/model/rope.h"

#include <cmath>
#include <numbers>

#include "gtest/gtest.h"

namespace pipetrain::model {
namespace {

TransformerConfig Llama(int d_model, int n_heads, double theta) {
  TransformerConfig c{.vocab_size = 16, .seq_len = 4, .d_model = d_model, .n_heads = n_heads,
                      .n_layers = 1};
  c.family = "llama";
  c.n_kv_heads = n_heads;
  c.ffn_dim = 8;
  c.rope_theta = theta;
  c.norm_eps = 1e-5;
  return c;
}

TEST(RopeTest, FrequenciesAndTables) {
  const TransformerConfig c = Llama(16, 2, 10000);  // heads of 8: four pairs
  const std::vector<double> inv = RotaryInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[1], 0.1);   // 10000^(-2/8)
  EXPECT_DOUBLE_EQ(inv[2], 0.01);  // 10000^(-4/8)
  EXPECT_DOUBLE_EQ(inv[3], 0.001);
  const RotaryTables t = MakeRotaryTables(c);
  ASSERT_EQ(t.cos.size(), 4u * 4u);
  EXPECT_EQ(t.cos[0], 1.0);  // position 0 turns nothing
  EXPECT_EQ(t.sin[0], 0.0);
  EXPECT_DOUBLE_EQ(t.cos[3 * 4 + 1], std::cos(3 * 0.1));  // position 3, pair 1
  EXPECT_DOUBLE_EQ(t.sin[3 * 4 + 1], std::sin(3 * 0.1));
}

// Llama 3.1 8B's scaling (factor 8, low 1, high 4, original context 8192) on heads of 128.
TEST(RopeTest, Llama3ScalingKeepsShortStretchesLongBlendsBetween) {
  TransformerConfig c = Llama(4096, 32, 500000);
  const std::vector<double> plain = RotaryInverseFrequencies(c);
  c.rope_scaling = {8, 1, 4, 8192};
  const std::vector<double> scaled = RotaryInverseFrequencies(c);
  ASSERT_EQ(scaled.size(), 64u);
  int kept = 0, stretched = 0, blended = 0;
  for (size_t i = 0; i < scaled.size(); ++i) {
    const double wavelength = 2 * std::numbers::pi / plain[i];
    if (wavelength < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++kept;
    } else if (wavelength > 8192.0 / 1) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 8) << i;
      ++stretched;
    } else {
      EXPECT_LT(scaled[i], plain[i]) << i;
      EXPECT_GT(scaled[i], plain[i] / 8) << i;
      ++blended;
    }
    if (i > 0) {
      EXPECT_LT(scaled[i], scaled[i - 1]) << "frequencies fall with the pair index";
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(blended, 0);
}

}  // namespace
}  // namespace pipetrain::model
