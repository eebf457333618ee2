// SPDX-License-Identifier: Apache-2.0
// Tile configurations that fit SM86's 99 KB of opt-in shared memory per block (also used
// on SM80 for 8 and 16 heads per block). See config_sm80.h for the table.
#pragma once

#include "tile_config.h"

namespace deepinfer_sm80::attention {

using CfgH16 = TileConfig<16, 32, 8, 2, 2, 2, 4>;
using CfgH8 = TileConfig<8, 32, 8, 1, 2, 1, 2>;

constexpr int kSmemCapSm86 = 99 * 1024;

}  // namespace deepinfer_sm80::attention
