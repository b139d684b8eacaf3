// The dashboard's files (index.html, dashboard.js, dashboard.css in this folder),
// compiled into the coordinator by embed_assets.cmake: the HTTP API serves them from
// memory, so a deployed binary needs no source tree and nothing from elsewhere.
#pragma once

#include <string_view>

#include "absl/types/span.h"

namespace pipetrain::coordinator {

struct DashboardAsset {
  std::string_view path;          // "/dashboard.js"
  std::string_view content_type;  // "text/javascript; charset=utf-8"
  std::string_view body;
};

// Every embedded file (generated).
absl::Span<const DashboardAsset> DashboardAssets();

// The file served at `path`, or nullptr.
const DashboardAsset* FindDashboardAsset(std::string_view path);

}  // namespace pipetrain::coordinator
