// The torch.ops namespace of one build. kernels/cpu/build.py names it per extension and ISA path
// (-DPAGEDSERVE_LIBRARY=pagedserve_layer_ops_avx2), so the paths of one op load side by side in one
// process: the worker loads the best, the tests load every path the CPU runs.
#pragma once
#include <torch/library.h>

#ifndef PAGEDSERVE_LIBRARY
#error "build with -DPAGEDSERVE_LIBRARY=<namespace> (kernels/cpu/build.py sets it)"
#endif

// One level of indirection so PAGEDSERVE_LIBRARY expands before TORCH_LIBRARY pastes it into names.
#define PAGEDSERVE_TORCH_LIBRARY_(ns, m) TORCH_LIBRARY(ns, m)
#define PAGEDSERVE_TORCH_LIBRARY_IMPL_(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
#define PAGEDSERVE_TORCH_LIBRARY(m) PAGEDSERVE_TORCH_LIBRARY_(PAGEDSERVE_LIBRARY, m)
#define PAGEDSERVE_TORCH_LIBRARY_IMPL(key, m) PAGEDSERVE_TORCH_LIBRARY_IMPL_(PAGEDSERVE_LIBRARY, key, m)
// The namespace as a string literal ("pagedserve_quant_linear_avx2"), for ops that look up others by name.
#define PAGEDSERVE_STR_(x) #x
#define PAGEDSERVE_STR(x) PAGEDSERVE_STR_(x)
#define PAGEDSERVE_LIBRARY_NAME PAGEDSERVE_STR(PAGEDSERVE_LIBRARY)
// A second source of one library (another .cpp of the same extension) adds its ops as a fragment.
#define PAGEDSERVE_TORCH_LIBRARY_FRAGMENT_(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define PAGEDSERVE_TORCH_LIBRARY_FRAGMENT(m) PAGEDSERVE_TORCH_LIBRARY_FRAGMENT_(PAGEDSERVE_LIBRARY, m)
