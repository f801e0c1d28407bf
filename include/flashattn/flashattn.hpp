// flashattn/flashattn.hpp — umbrella header of the public C++ API.
#pragma once

#include "flashattn/attention.hpp"
#include "flashattn/config.hpp"
#include "flashattn/error.hpp"
#include "flashattn/fp8.hpp"
#include "flashattn/kvcache.hpp"
#include "flashattn/mask.hpp"
#include "flashattn/online_softmax.hpp"
#include "flashattn/tensor.hpp"
