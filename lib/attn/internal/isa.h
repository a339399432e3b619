// How a CPU kernel source is compiled once per instruction set.
//
// CMake compiles each kernel source once per CpuIsa (attn/cpu_isa.h) the
// build has, defining ATTN_ISA_BASELINE, ATTN_ISA_AVX2 or ATTN_ISA_AVX512
// (lib/CMakeLists.txt).
// A kernel source includes everything it needs first, then writes
//
//   ATTN_ISA_BEGIN
//   namespace attn::internal::ATTN_ISA_NAMESPACE { ... }
//   ATTN_ISA_END
//
// so that
// - its own functions, lambdas and OpenMP bodies are compiled for the
//   instruction set (a target region, not a -m flag on the whole file), while
//   inline functions of the standard library and Abseil that the compiler
//   emits out of line stay baseline x86-64: the linker keeps one copy of each
//   such function for the whole program, and with a -mavx2 file it might keep
//   the AVX2 one and crash a CPU without AVX2 in unrelated code;
// - the copies never share a symbol (one namespace per instruction set).
// tests/isa/check_isa_objects.py checks both on the object files.
#ifndef ATTN_INTERNAL_ISA_H_
#define ATTN_INTERNAL_ISA_H_

#if defined(ATTN_ISA_AVX512)
#define ATTN_ISA_NAMESPACE avx512
// 512-bit vectors preferred: GCC's generic tuning would otherwise keep the
// auto-vectorized loops at 256 bits.
#if defined(__clang__)
// clang-format off
#define ATTN_ISA_BEGIN _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512dq,avx512vl,avx2,fma\"))), apply_to = function)")
// clang-format on
#define ATTN_ISA_END _Pragma("clang attribute pop")
#else
#define ATTN_ISA_BEGIN                                                      \
  _Pragma("GCC push_options") _Pragma(                                      \
      "GCC target(\"avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,prefer-vector-width=512\")")
#define ATTN_ISA_END _Pragma("GCC pop_options")
#endif
#elif defined(ATTN_ISA_AVX2)
#define ATTN_ISA_NAMESPACE avx2
#if defined(__clang__)
// clang-format off
#define ATTN_ISA_BEGIN _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)")
// clang-format on
#define ATTN_ISA_END _Pragma("clang attribute pop")
#else
#define ATTN_ISA_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma\")")
#define ATTN_ISA_END _Pragma("GCC pop_options")
#endif
#elif defined(ATTN_ISA_BASELINE)
#define ATTN_ISA_NAMESPACE baseline
#define ATTN_ISA_BEGIN
#define ATTN_ISA_END
#else
#error "compile kernel sources through lib/CMakeLists.txt's per-ISA copies"
#endif

#endif  // ATTN_INTERNAL_ISA_H_
