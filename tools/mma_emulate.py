"""Run the tensor-core kernels' CUDA C (convlab/kernels/csrc/mma_sync.cu and wgmma_tma.cu)
on the CPU, to test their index, fragment and pipeline logic without a GPU (a developer
tool and the engine of tests/test_mma.py and tests/test_wgmma.py; needs g++ with C++20).

    .venv/bin/python tools/mma_emulate.py        # mma.sync: the ladder and every candidate

The .cu file itself is compiled by g++, one copy per configuration (its -D switches from
``MmaConfig.defines`` / ``WgmmaConfig.defines``) in a namespace of one library. Only the
bodies of its PTX helpers are replaced, by models of what the instructions do (PTX ISA);
each helper must still hold the exact instruction and operand binding its model stands for,
and no other inline assembly may be left. For mma_sync.cu:

- ``ldmatrix.sync.aligned.m8n8.x4.b16``: lane l gives the address of row l % 8 of matrix
  l / 8; lane t receives in register i the two 16-bit elements (row t / 4, columns
  2 (t % 4), +1) of matrix i (low half first). The addresses are checked (inside the
  block's shared memory, 16-byte aligned) and each 8-lane phase is checked for bank
  conflicts (eight 16-byte rows in eight distinct 16-byte bank groups);
- ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}``: with g = lane / 4, t = lane % 4,
  A's a0..a3 hold (row g, k 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..);
  B's b0 (k 2t..2t+1, n g), b1 (k 2t + 8.., n g); C's c0, c1 (row g, columns 2t, 2t + 1),
  c2, c3 (row g + 8, ...). The emulated warp exchanges every lane's registers and each
  lane computes its own four outputs, so a wrong register order shows as a wrong answer;
- ``cp.async.cg`` 16 bytes with src-size 0 writes zeros and reads nothing; copies land at
  issue ("early") or only at the ``cp.async.wait_group`` that guarantees them ("late");
  sources must lie inside the operands, 16-byte aligned. Races are checked apart from the
  order a run takes (its warps move almost in lockstep): a copy is in flight from its
  issue to the wait_group that completes it, and a read of that 16-byte unit by another
  thread with no ``__syncthreads`` between (or by the issuing thread before its wait), or
  a copy onto a unit another thread read since the last barrier, is a fault;
  ``cvt.rn.f16x2.f32 d, a, b``
  puts a in the high half of d and b in the low half.

Blocks run one after the other; a block's CUDA threads are fibers (ucontext) of one OS
thread, each running until it waits at a barrier, so a run is deterministic and cheap.
``__syncthreads`` is a barrier over the block and each warp-collective instruction one
over the warp (all 32 lanes must issue the same sequence; a barrier that some threads
never reach is reported as a deadlock).
Shared memory is exactly ``smem_bytes()`` of the config per block, poisoned with NaN and
fenced by guard words, as are the operands and the output: a read of anything unwritten
or out of range shows up as NaN, a write out of range as a changed guard.

For wgmma_tma.cu (`WgmmaEmulator`): ``cp.async.bulk.tensor`` copies a box of a tensor map
(made by `encode_tensor_map`, the stand-in for ``cuTensorMapEncodeTiled``) with the
128-byte swizzle and zeros out of range, then completes its bytes on the mbarrier, at
issue or only when someone waits on that barrier; mbarriers count arrivals and bytes and
flip their phase (``try_wait.parity`` P passes once the phase of parity P is over);
``wgmma.mma_async.m64nNk16`` reads A and B through the matrix descriptors (start, stride
offset, 128-byte swizzle) and each thread adds into its accumulators by the D-fragment
layout, at issue or only at the ``wgmma.wait_group`` that guarantees it. After each
arrival the waiting side runs first, so a slot released too early is overwritten.
"""

from __future__ import annotations

import ctypes
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GUARD = 64          # 16-bit guard words around every buffer
# around the operands: more than any tile reads past their ends (a tile's rows x Kd), so a
# copy past an operand lands in its own guard, never in the other operand, whose bounds
# the emulator's copies accept (heap neighbours had let such a copy pass unseen)
OPERAND_GUARD = 1 << 16
OPT = "-Og"         # the runs are tiny: compile time dominates
POISON = 0xFFFF     # NaN in fp16 and in bf16

PRELUDE = r"""
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>
#include <ucontext.h>
using std::min; using std::max;
struct dim3_ { unsigned x = 0, y = 0, z = 0; };
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
struct float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
template <class T> inline T __ldcg(const T* p) { return *p; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
inline size_t __cvta_generic_to_shared(const void* p) { return (size_t)p; }

namespace emu {
typedef unsigned short u16;
struct Copy { void* dst; const void* src; bool valid; bool landed; long long id; };
struct WgOp { float* d; unsigned long long da, db; int scale_d, n, serial; };  // a wgmma
struct Fiber {    // one CUDA thread
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;
    dim3_ tid;
    bool done = false;
    int phase = 0, ops = 0;
    std::vector<Copy> open;
    std::vector<std::vector<Copy>> groups;
    int wg_serial = 0;
    std::vector<WgOp> wg_open;
    std::vector<std::vector<WgOp>> wg_groups;
};
Fiber* cur = nullptr;
dim3_ block, grid;
}  // namespace emu
#define threadIdx (emu::cur->tid)
#define blockIdx (emu::block)
#define gridDim (emu::grid)

namespace emu {
int errors = 0, conflicts = 0;
long long progress = 0;
u16* smem = nullptr;               // the dynamic shared memory of the running block
size_t smem_bytes = 0, smem_shift = 0;
uintptr_t window = 0;              // shared-window address 0 (1024-byte aligned); smem at +shift
void (*on_block)() = nullptr;      // per-block reset of instruction models
int (*on_block_end)() = nullptr;   // faults left at the end of a block
uintptr_t bounds[4];          // [A begin, A end, B begin, B end) in bytes
int late = 0;
ucontext_t sched;
void (*body)(void*) = nullptr;
void* body_ctx = nullptr;
struct Bar { int count = 0, arrived = 0; unsigned gen = 0; };
Bar block_bar;
struct Exchange {
    int tag[32], built;
    const u16* addr[32];
    unsigned a[32][4], b[32][2];
    float A[16][16], B[16][8];   // the mma operands, assembled once per warp
};
struct Warp { Bar bar; Exchange x[2]; };
std::vector<Warp> warps;

inline void yield() { swapcontext(&cur->ctx, &sched); }
inline void arrive_and_wait(Bar& b) {
    ++progress;
    const unsigned g = b.gen;
    if (++b.arrived == b.count) { b.arrived = 0; ++b.gen; return; }
    while (b.gen == g) yield();
}
inline bool in_smem(const void* p, size_t n) {
    auto a = (uintptr_t)p, s = (uintptr_t)smem;
    return a >= s && a + n <= s + smem_bytes;
}
inline bool in_operand(const void* p, size_t n) {
    auto a = (uintptr_t)p;
    return (a >= bounds[0] && a + n <= bounds[1]) || (a >= bounds[2] && a + n <= bounds[3]);
}
inline void land(const Copy& c) {
    if (c.valid) std::memcpy(c.dst, c.src, 16); else std::memset(c.dst, 0, 16);
}
// Races between cp.async writes and ldmatrix reads of shared memory, per 16-byte unit, by
// barrier intervals (block_bar.gen: the __syncthreads passed so far). A copy is in flight
// from its issue until the wait_group that completes it; another thread's read in an
// interval in which the copy was in flight, a copy issued in an interval in which another
// thread read the unit (or wrote it), or a thread's read of its own copy before its
// wait_group, is a race: no barrier orders them, whatever order this run took.
struct Unit { int writer = -1, reader = -1; long long id = 0; unsigned w_to = 0, r_gen = ~0u;
              bool open = false, readers = false; };
std::vector<Unit> units;
long long copy_ids = 0;
inline Unit* unit_of(const void* p) {
    size_t i = ((uintptr_t)p - (uintptr_t)smem) / 16;
    return i < units.size() ? &units[i] : nullptr;
}
inline void note_write(Copy& c) {
    Unit* u = unit_of(c.dst);
    const int me = threadIdx.x;
    const unsigned g = block_bar.gen;
    if (u->r_gen == g && (u->reader != me || u->readers)) ++errors;
    if (u->writer >= 0 && u->writer != me && (u->open || u->w_to == g)) ++errors;
    c.id = ++copy_ids;
    u->writer = me; u->id = c.id; u->open = true;
}
inline void note_done(const Copy& c) {
    Unit* u = unit_of(c.dst);
    if (u->id == c.id) { u->open = false; u->w_to = block_bar.gen; }
}
inline void note_read(const void* p) {
    Unit* u = unit_of(p);
    const int me = threadIdx.x;
    const unsigned g = block_bar.gen;
    if (!u) return;
    if (u->writer >= 0 && (u->open || (u->writer != me && u->w_to == g))) ++errors;
    if (u->r_gen != g) { u->r_gen = g; u->reader = me; u->readers = false; }
    else if (u->reader != me) u->readers = true;
}
inline void cp_async16(void* dst, const void* src, bool valid) {
    if (!in_smem(dst, 16) || ((uintptr_t)dst & 15)) { ++errors; return; }
    if (valid && (!in_operand(src, 16) || ((uintptr_t)src & 15))) { ++errors; return; }
    Copy c{dst, src, valid, !late, 0};
    note_write(c);
    if (!late) land(c);
    cur->open.push_back(c);
}
inline void commit() { cur->groups.push_back(cur->open); cur->open.clear(); }
inline void wait(int n) {
    auto& gs = cur->groups;
    while ((int)gs.size() > n) {
        for (auto& c : gs.front()) {
            if (!c.landed) land(c);
            note_done(c);
        }
        gs.erase(gs.begin());
    }
}
// a warp-collective step: deposit, one barrier, read (two alternating exchange buffers)
inline Exchange& deposit(int kind) {
    Exchange& x = warps[threadIdx.x / 32].x[cur->phase];
    x.tag[threadIdx.x % 32] = (++cur->ops << 2) | kind;
    return x;
}
inline void meet(Exchange& x) {
    arrive_and_wait(warps[threadIdx.x / 32].bar);
    if (threadIdx.x % 32 == 0)
        for (int l = 1; l < 32; ++l) if (x.tag[l] != x.tag[0]) { ++errors; break; }
}
inline float to_f32(unsigned bits, int bf16) {
    bits &= 0xFFFF;
    if (bf16) { unsigned u = bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
    _Float16 h; u16 b = (u16)bits; std::memcpy(&h, &b, 2); return (float)h;
}
inline unsigned f16_bits(float f) {   // round to nearest even
    _Float16 h = (_Float16)f; u16 u; std::memcpy(&u, &h, 2); return u;
}
inline unsigned cvt_rn_f16x2(float hi, float lo) { return (f16_bits(hi) << 16) | f16_bits(lo); }
inline unsigned bf16_bits(float f) {  // round to nearest even (finite)
    unsigned u; std::memcpy(&u, &f, 4); return (u + 0x7FFF + ((u >> 16) & 1)) >> 16;
}
inline unsigned cvt_rn_bf16x2(float hi, float lo) { return (bf16_bits(hi) << 16) | bf16_bits(lo); }

inline void ldsm_x4(unsigned* r, const u16* p) {
    const int lane = threadIdx.x % 32;
    Exchange& x = deposit(1);
    x.addr[lane] = p;
    if (!in_smem(p, 16) || (((uintptr_t)p - (uintptr_t)smem) & 15)) ++errors;
    else note_read(p);
    meet(x);
    const u16* rows[32];
    for (int l = 0; l < 32; ++l) rows[l] = x.addr[l];
    cur->phase ^= 1;
    if (lane == 0)   // one phase per matrix: its 8 rows must hit 8 distinct bank groups
        for (int m = 0; m < 4; ++m) {
            int seen = 0;
            for (int j = 0; j < 8; ++j)
                seen |= 1 << ((((uintptr_t)rows[8 * m + j] - (uintptr_t)smem) >> 4) & 7);
            if (seen != 0xFF) ++conflicts;
        }
    for (int i = 0; i < 4; ++i) {
        const u16* row = rows[8 * i + lane / 4];
        r[i] = in_smem(row, 16) ? row[2 * (lane % 4)] | (unsigned)row[2 * (lane % 4) + 1] << 16
                                : 0xFFFFFFFFu;
    }
}
inline void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1, int bf16) {
    const int lane = threadIdx.x % 32;
    Exchange& x = deposit(2);
    for (int i = 0; i < 4; ++i) x.a[lane][i] = a[i];
    x.b[lane][0] = b0; x.b[lane][1] = b1;
    meet(x);
    if (x.built != x.tag[0]) {   // the first lane past the barrier assembles A and B
        x.built = x.tag[0];
        for (int l = 0; l < 32; ++l) {
            const int g = l / 4, t = l % 4;
            for (int e = 0; e < 2; ++e) {
                x.A[g][2 * t + e] = to_f32(x.a[l][0] >> (16 * e), bf16);
                x.A[g + 8][2 * t + e] = to_f32(x.a[l][1] >> (16 * e), bf16);
                x.A[g][2 * t + 8 + e] = to_f32(x.a[l][2] >> (16 * e), bf16);
                x.A[g + 8][2 * t + 8 + e] = to_f32(x.a[l][3] >> (16 * e), bf16);
                x.B[2 * t + e][g] = to_f32(x.b[l][0] >> (16 * e), bf16);
                x.B[2 * t + 8 + e][g] = to_f32(x.b[l][1] >> (16 * e), bf16);
            }
        }
    }
    const auto& A = x.A;
    const auto& B = x.B;
    cur->phase ^= 1;
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        double s = 0;
        for (int k = 0; k < 16; ++k) s += (double)A[row][k] * B[k][col];
        c[e] = (float)((double)c[e] + s);
    }
}
inline void syncthreads() { arrive_and_wait(block_bar); }
inline void syncwarp() { arrive_and_wait(warps[threadIdx.x / 32].bar); }

void entry() { body(body_ctx); cur->done = true; }

// Blocks one after the other; a block's threads are fibers of this one OS thread, each
// running until it waits at a barrier; passes alternate forward and backward (the first
// backward with bit 1 of late_: plain shared-memory races show in one order or the other).
// A pass in which no thread moves is a deadlock (a barrier some threads never reach).
template <typename F>
int run_grid(unsigned gx, unsigned gy, unsigned nt, size_t smem_bytes_, const long long* bnd,
             int late_, F fn) {
    errors = 0; conflicts = 0; late = late_ & 1;
    const int flip = (late_ >> 1) & 1;
    body = [](void* f) { (*(F*)f)(); };
    body_ctx = &fn;
    for (int i = 0; i < 4; ++i) bounds[i] = (uintptr_t)bnd[i];
    grid = {gx, gy, 1};
    const size_t guard = 512, words = smem_bytes_ / 2, stack = 256 * 1024;
    std::vector<u16> buf(words + 2 * guard + 2048);
    for (unsigned by = 0; by < gy; ++by) for (unsigned bx = 0; bx < gx; ++bx) {
        window = ((uintptr_t)buf.data() + 2 * guard + 1023) & ~(uintptr_t)1023;
        u16* base = (u16*)(window + smem_shift) - guard;
        std::fill(buf.begin(), buf.end(), (u16)0xFFFF);
        smem = base + guard; smem_bytes = smem_bytes_;
        if (on_block) on_block();
        units.assign(smem_bytes_ / 16, Unit{});
        block = {bx, by, 0};
        block_bar = Bar{(int)nt};
        warps.assign(nt / 32, Warp{});
        for (auto& w : warps) w.bar.count = 32;
        std::vector<Fiber> fs(nt);
        for (unsigned t = 0; t < nt; ++t) {
            Fiber& f = fs[t];
            f.tid = {t, 0, 0};
            f.stack.reset(new char[stack]);
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.get();
            f.ctx.uc_stack.ss_size = stack;
            f.ctx.uc_link = &sched;
            makecontext(&f.ctx, entry, 0);
        }
        for (int pass = 0;; ++pass) {
            const long long before = progress;
            int live = 0;
            for (unsigned k = 0; k < nt; ++k) {
                Fiber& f = fs[(pass + flip) % 2 ? nt - 1 - k : k];
                if (f.done) continue;
                cur = &f;
                swapcontext(&sched, &f.ctx);
                if (f.done) {
                    ++progress;
                    if (!f.open.empty() || !f.groups.empty()) ++errors;       // never waited for
                    if (!f.wg_open.empty() || !f.wg_groups.empty()) ++errors;
                }
                else ++live;
            }
            if (!live) break;
            if (progress == before) { ++errors; break; }   // deadlock
        }
        for (size_t i = 0; i < guard; ++i)
            if (base[i] != 0xFFFF || smem[words + i] != 0xFFFF) { ++errors; break; }
        if (on_block_end) errors += on_block_end();
    }
    return errors;
}
}  // namespace emu
#define __syncthreads emu::syncthreads
#define __syncwarp emu::syncwarp
"""

# PTX helpers of mma_sync.cu: the instruction (and operand binding) each must contain,
# which is what the model assumes, and the body that replaces it
# both kernels' shared addresses: offsets from the block's shared window (emu::window)
SMEM_ADDR = (["__cvta_generic_to_shared(p)"], "return (unsigned)((uintptr_t)p - emu::window);")
HELPERS = {
    "smem_addr": SMEM_ADDR,
    "cp_async16": (['cp.async.cg.shared.global [%0], [%1], 16, %2;',
                    ':: "r"(dst), "l"(src), "r"(valid ? 16 : 0)'],
                   "emu::cp_async16((void*)(emu::window + dst), src, valid);"),
    "cp_async_commit": (["cp.async.commit_group;"], "emu::commit();"),
    "cp_async_wait": (['cp.async.wait_group %0;', ':: "n"(N)'], "emu::wait(N);"),
    "ldsm_x4": (["ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];",
                 ': "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr)'],
                "emu::ldsm_x4(r, (const emu::u16*)(emu::window + addr));"),
    "mma16816": (["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ",
                  "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 ",
                  "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};",
                  ': "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), '
                  '"r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)'],
                 "emu::mma16816(c, a, b0, b1, BF16);"),
    # stream-K's flags: blocks run one after the other, so a flag a block waits for is
    # raised already, or never will be (a wait on a later block: a fault, not a hang)
    "flag_release": (["fence.acq_rel.gpu;", "st.relaxed.gpu.global.u32 [%0], %1;",
                      ':: "l"(f), "r"(1u) : "memory"'], "*f = 1u;"),
    "flag_acquire": (["ld.acquire.gpu.global.u32 %0, [%1];", ': "=r"(v) : "l"(f) : "memory"'],
                     "if (*f != 1u) ++emu::errors; return 1u;"),
}
_CVT = re.compile(r'asm\("cvt\.rn\.f16x2\.f32 %0, %1, %2;\\n"\s*:\s*"=r"\((\w+)\)\s*:\s*'
                  r'"f"\((\w+)\),\s*"f"\((\w+)\)\);')
_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w+(?: \w+)*?)\s+(\w+)\[\];")


def _flat(text: str) -> str:
    """C text with adjacent string literals joined and white space collapsed."""
    text = re.sub(r'(\\n)?"\s*(#[^\n]*\n\s*)*"', " ", text)
    return re.sub(r"\s+", " ", text)


def _replace_body(src: str, name: str, must: list, body: str) -> str:
    """Replace the body of the __device__ function `name` (exactly one definition), after
    checking that it holds the PTX (text in `must`) that the model stands for."""
    hits = [m for m in re.finditer(rf"__device__[^;{{}}]*?\b{name}\s*\(", src)]
    if len(hits) != 1:
        raise ValueError(f"emulator: expected one definition of {name}, found {len(hits)}")
    start = src.index("{", hits[0].end())
    depth = 0
    for i in range(start, len(src)):
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        if depth == 0:
            flat = _flat(src[start:i])
            for text in must:
                if _flat(text) not in flat:
                    raise ValueError(f"emulator: {name} no longer contains {text!r}; the "
                                     "model of its instruction must be revisited")
            return src[:start + 1] + " " + body + " " + src[i:]
    raise ValueError(f"emulator: unbalanced braces in {name}")


def emulated_source(src: str) -> str:
    """The .cu text with the PTX helpers modelled in C++ (raises if a hook is missing or
    if any inline assembly is left that the emulator does not model)."""
    for name, (must, body) in HELPERS.items():
        src = _replace_body(src, name, must, body)
    src, n = _CVT.subn(r"\1 = emu::cvt_rn_f16x2(\2, \3);", src)
    if n != 1:
        raise ValueError(f"emulator: expected one cvt.rn.f16x2.f32, found {n}")
    src, n = _SHARED.subn(r"\1* \2 = (\1*)emu::smem;", src)
    if n != 1:
        raise ValueError(f"emulator: expected one extern __shared__ array, found {n}")
    if src.count('extern "C"') != 1:
        raise ValueError("emulator: expected one extern \"C\" kernel")
    src = src.replace('extern "C"', "")
    left = [ln.strip() for ln in src.splitlines() if re.search(r"\basm\b", ln)]
    if left:
        raise ValueError(f"emulator: inline assembly it does not model: {left}")
    return src


def load_module(module: str = "mma02_gemm_conv_cuda"):
    """convlab.kernels.<module> without importing convlab.kernels (which imports numba)."""
    import importlib.util

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    name = f"convlab.kernels.{module}"
    if name in sys.modules:
        return sys.modules[name]
    pkg = types.ModuleType("convlab.kernels")
    pkg.__path__ = [str(ROOT / "convlab" / "kernels")]
    sys.modules.setdefault("convlab.kernels", pkg)
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "convlab" / "kernels" / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class Spec:
    """One compiled configuration: the tile config and the extra switches."""

    cfg: object          # MmaConfig
    conv: bool = False
    out_f16: bool = False
    bf16: bool = False

    def defines(self) -> tuple:
        return self.cfg.validate().defines(CONV=self.conv, OUT_F16=self.out_f16,
                                           BF16=self.bf16)


def kernel_scalars(source: str, kernel: str = "mma_sync_kernel", pointers: int = 4) -> tuple:
    """Names of a kernel's int parameters, in order (after its `pointers` pointers)."""
    m = re.search(rf"{kernel}\(([^)]*)\)", source)
    params = [p.split() for p in m.group(1).split(",")]
    if any(p[0] == "int" for p in params[:pointers]) or any(p[0] != "int"
                                                             for p in params[pointers:]):
        raise ValueError(f"{kernel}: expected {pointers} pointers, then ints: {params}")
    return tuple(p[-1] for p in params[pointers:])


def _macros(src: str) -> set:
    return set(re.findall(r"^\s*#\s*define\s+(\w+)", src, re.M))


def library_source(specs, sources) -> str:
    """One C++ library: spec i compiled from sources[i] in namespace cfg<i>."""
    parts = [PRELUDE]
    for i, (s, source) in enumerate(zip(specs, sources, strict=True)):
        body, undef = emulated_source(source), _macros(source)
        defs = [d[2:].split("=") for d in s.defines()]
        parts += [f"#define {k} {v}" for k, v in defs]
        parts += [f"namespace cfg{i} {{", body,
                  "constexpr int emu_threads = NTHREADS;", "}"]
        parts += [f"#undef {m}" for m in sorted(undef | {k for k, _ in defs})]
        parts.append(
            f'extern "C" int run{i}(const void* A, const void* B, void* C, float* Wk, '
            f"const long long* bnd, const int* s, unsigned gx, unsigned gy, unsigned nt, "
            f"long long smem, int late) "
            f"{{ return emu::run_grid(gx, gy, nt, smem, bnd, late, [=] {{ "
            f"cfg{i}::mma_sync_kernel((const cfg{i}::u16*)A, (const cfg{i}::u16*)B, C, Wk, "
            + ", ".join(f"s[{j}]" for j in range(len(kernel_scalars(source)))) + "); }); }")
        parts.append(f'extern "C" int threads{i}() {{ return cfg{i}::emu_threads; }}')
        parts.append(f'extern "C" int smem_off{i}(int r, int c) {{ '
                     f'return cfg{i}::smem_off(r, c); }}')
    parts.append('extern "C" int conflicts() { return emu::conflicts; }')
    return "\n".join(parts)


def _aligned(n_words: int, guard: int = GUARD) -> tuple[np.ndarray, np.ndarray]:
    """A uint16 buffer of n_words between guards, 128-byte aligned: (whole, interior)."""
    raw = np.full(n_words + 2 * guard + 64, POISON, np.uint16)
    shift = (-raw.ctypes.data % 128) // 2
    whole = raw[shift:shift + n_words + 2 * guard]
    return whole, whole[guard:guard + n_words]


def out_guard(cfg, N: int) -> int:
    """Guard words after C wide enough for a whole block tile written without masks."""
    return 2 * (cfg.BM * N + cfg.BN) + GUARD


def bits(a: np.ndarray) -> np.ndarray:
    """16-bit patterns of an fp16 array, or of bf16 (given as uint16) unchanged."""
    return a.view(np.uint16) if a.dtype == np.float16 else a.astype(np.uint16)


def bf16_to_f64(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (round to nearest even; finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def compile_library(src: str, stem: str, workdir=None) -> ctypes.CDLL:
    """g++ -shared of `src` at OPT, cached by content (`wmma_emulate.compile_library`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("wmma_emulate",
                                                  ROOT / "tools" / "wmma_emulate.py")
    wm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wm)
    return wm.compile_library(src, stem, workdir, flags=(OPT,))


class Emulator:
    """The kernel, compiled for `specs`, run on the CPU."""

    def __init__(self, specs, workdir=None, sources=None):
        """sources: the .cu text per spec (default: the kernel's file for all)."""
        self.specs = list(specs)
        src = library_source(self.specs, sources or [load_module().source()] * len(specs))
        self.lib = compile_library(src, "mma_emulate", workdir)
        self.scalars = kernel_scalars(load_module().source())
        for i, s in enumerate(self.specs):
            if getattr(self.lib, f"threads{i}")() != s.cfg.threads:
                raise ValueError(f"{s.cfg}: MmaConfig.threads differs from the kernel's NTHREADS")
        self.errors = self.conflicts = 0

    def smem_off(self, i: int, r: int, c: int) -> int:
        return getattr(self.lib, f"smem_off{i}")(r, c)

    def launch(self, i, grid, block, args, shared_mem, operands, late=True) -> None:
        """Run spec i as CuPy would launch it: grid (x, y), block (threads,), args = the
        four pointers then the int scalars; reads outside `operands` (arrays) are faults.
        late: bit 0, copies land only at the wait that guarantees them; bit 1, the threads'
        order after each barrier reversed. Sets self.errors and self.conflicts."""
        s = self.specs[i]
        if tuple(block) != (s.cfg.threads,) or shared_mem != s.cfg.smem_bytes():
            raise ValueError(f"{s.cfg}: launched with block {block}, {shared_mem} bytes")
        ptrs, sc = [int(v) for v in args[:4]], np.array([int(v) for v in args[4:]], np.int32)
        if sc.size != len(self.scalars):
            raise ValueError(f"{sc.size} scalars for a kernel taking {len(self.scalars)}")
        bnd = np.array([v for a in operands for v in (a.ctypes.data, a.ctypes.data + a.nbytes)],
                       np.int64)
        p = ctypes.c_void_p
        self.errors = getattr(self.lib, f"run{i}")(
            p(ptrs[0]), p(ptrs[1]), p(ptrs[2]), p(ptrs[3]), p(bnd.ctypes.data),
            p(sc.ctypes.data),
            ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(s.cfg.threads),
            ctypes.c_longlong(s.cfg.smem_bytes()), ctypes.c_int(int(late)))
        self.conflicts = self.lib.conflicts()

    def _run(self, i, a, b, out_shape, values, late, sms=None):
        """Operands and output between NaN guards; the launcher's grid (stream-K's split
        for `sms` SMs, its workspace's sums NaN and guarded, its flags zero before and
        after)."""
        m2 = load_module()
        s = self.specs[i]
        wa, ia = _aligned(a.size, OPERAND_GUARD)
        wb, ib = _aligned(b.size, OPERAND_GUARD)
        ia[:] = bits(a).ravel()
        ib[:] = bits(b).ravel()
        n_out = int(np.prod(out_shape)) * (1 if s.out_f16 else 2)
        g = out_guard(s.cfg, values["N"])
        wc, ic = _aligned(n_out, g)
        values = dict(values, sk_tiles=0, sk_blocks=0)
        if s.cfg.STREAMK:
            values["sk_tiles"], values["sk_blocks"] = m2.stream_k_split(
                s.cfg, values["M"], values["N"], values["Kd"], sms or 132)
        grid = m2.grid_of(s.cfg, values["M"], values["N"], values["sk_tiles"],
                          values["sk_blocks"])
        n_work = m2.work_floats(s.cfg, values["sk_blocks"])
        ww, iw = _aligned(2 * n_work, GUARD)
        iw.view(np.float32)[:m2.SK_FLAGS] = 0
        args = [ia.ctypes.data, ib.ctypes.data, ic.ctypes.data, iw.ctypes.data if n_work else 0]
        args += [values.get(k, 0) for k in self.scalars]
        self.launch(i, grid, (s.cfg.threads,), args, s.cfg.smem_bytes(), (ia, ib), late)
        guards = np.concatenate([wc[:g], wc[g + n_out:], wa[:GUARD], wa[-GUARD:],
                                 wb[:GUARD], wb[-GUARD:], ww[:GUARD], ww[-GUARD:]])
        self.errors += int(np.count_nonzero(guards != POISON))
        self.errors += int(np.count_nonzero(iw.view(np.uint32)[:m2.SK_FLAGS]) if n_work else 0)
        self.errors += int(not np.array_equal(ia, bits(a).ravel()))
        out = ic.view(np.float16 if s.out_f16 else np.float32).reshape(out_shape)
        return out.astype(np.float32)

    def gemm(self, i, a, bt, late=True, sms=None) -> np.ndarray:
        """C = A @ B^T with a (M, K), bt (N, K) fp16 (or bf16 bits as uint16); stream-K
        split for `sms` SMs (default 132)."""
        (M, K), N = a.shape, bt.shape[0]
        return self._run(i, a, bt, (M, N), dict(M=M, N=N, Kd=K), late, sms)

    def conv(self, i, x, w, stride=1, padding=0, dilation=1, late=True) -> np.ndarray:
        """Implicit-GEMM conv: x (N, H, W, C), w (K, R, S, C) -> (N, P, Q, K) (NHWC)."""
        from convlab.reference import conv_params

        Nb, H, W, C = x.shape
        K, R, S, _ = w.shape
        p = conv_params((Nb, C, H, W), (K, C, R, S), stride, padding, dilation)
        (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
        values = dict(M=Nb * p.P * p.Q, N=K, Kd=R * S * C, H=H, W=W, C=C, P=p.P, Q=p.Q, S=S,
                      sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw)
        return self._run(i, x, w, (Nb, p.P, p.Q, K), values, late)


# ----------------------------------------------------------------------------------------
# The Hopper kernel (csrc/wgmma_tma.cu): wgmma, TMA and mbarriers modelled the same way

WG_PRELUDE = r"""
namespace emu { namespace wg {
typedef unsigned long long u64;
const u64 MAGIC = 0x70616d74756d65ull;   // "emutmap": a tensor map of this emulator
struct Map {
    u64 magic, ptr;
    unsigned rank, elem;
    u64 dims[5], strides[4];
    unsigned box[5], swizzle;
};
struct MBar { int expected = 0, pending = 0; long long tx = 0; unsigned phase = 0; };
std::vector<std::pair<const void*, MBar>> bars;
struct Tma { void* dst; const Map* map; void* bar; int c[5]; int rank; };
std::vector<Tma> tmas;   // issued, not landed yet (late mode)
int tma_late = 0, wg_late = 0;

struct Tile;
void reset();
int leftover();
MBar* find(const void* p) {
    for (auto& b : bars) if (b.first == p) return &b.second;
    return nullptr;
}
MBar& get(const void* p) {
    MBar* b = find(p);
    if (!b) { ++errors; bars.push_back({p, MBar{}}); b = &bars.back().second; }  // no init
    return *b;
}
void done_check(MBar& b) {
    if (b.pending == 0 && b.tx == 0) { ++b.phase; b.pending = b.expected; ++progress; }
}
void mbar_init(void* p, int count) {
    if (!in_smem(p, 8) || ((uintptr_t)p & 7)) ++errors;
    MBar* b = find(p);
    if (!b) { bars.push_back({p, MBar{}}); b = &bars.back().second; }
    *b = MBar{count, count, 0, 0};
}
void arrive_only(void* p) {
    MBar& b = get(p);
    if (b.pending <= 0) { ++errors; return; }   // more arrivals than the count
    --b.pending; ++progress;
    done_check(b);
}
// after an arrival the waiting side runs first: a slot released too early gets overwritten
void arrive(void* p) { arrive_only(p); yield(); }
void expect_tx(void* p, unsigned bytes) { get(p).tx += bytes; arrive_only(p); }

// TMA tile copy with the 128-byte swizzle; out-of-range elements are zeros
void land(const Tma& t) {
    const Map* m = t.map;
    if (m->magic != MAGIC || (int)m->rank != t.rank) { ++errors; return; }
    if ((((uintptr_t)t.dst - window) & 1023) || m->box[0] * m->elem != 128 || m->swizzle != 3)
        ++errors;
    size_t rows = 1;
    for (int i = 1; i < t.rank; ++i) rows *= m->box[i];
    const size_t bytes = rows * 128;
    if (!in_smem(t.dst, bytes)) { ++errors; return; }
    for (size_t row = 0; row < rows; ++row) {
        long long ci[5];
        size_t rest = row;
        bool in = true;
        for (int i = 1; i < t.rank; ++i) {
            ci[i] = t.c[i] + (long long)(rest % m->box[i]);
            rest /= m->box[i];
            in = in && ci[i] >= 0 && ci[i] < (long long)m->dims[i];
        }
        for (unsigned b0 = 0; b0 < m->box[0]; ++b0) {
            const long long c0 = t.c[0] + (long long)b0;
            u16 v = 0;
            if (in && c0 >= 0 && c0 < (long long)m->dims[0]) {
                uintptr_t src = m->ptr + c0 * m->elem;
                for (int i = 1; i < t.rank; ++i) src += ci[i] * m->strides[i - 1];
                if (in_operand((const void*)src, 2)) v = *(const u16*)src; else ++errors;
            }
            const size_t off = row * 128 + b0 * 2, phys = off ^ (((off >> 7) & 7) << 4);
            *(u16*)((char*)t.dst + phys) = v;
        }
    }
    MBar& b = get(t.bar);
    b.tx -= (long long)bytes;
    done_check(b);
}
void tma_load(void* dst, const void* map, void* bar, int rank, int c0, int c1, int c2, int c3) {
    Tma t{dst, (const Map*)map, bar, {c0, c1, c2, c3, 0}, rank};
    if (tma_late) tmas.push_back(t); else land(t);
}
void mbar_wait(void* p, int parity) {
    for (;;) {
        for (size_t i = 0; i < tmas.size();)   // late copies land when their barrier is waited on
            if (tmas[i].bar == p) { Tma t = tmas[i]; tmas.erase(tmas.begin() + i); land(t); }
            else ++i;
        if ((get(p).phase & 1) != (unsigned)parity) return;   // the phase of that parity is over
        yield();
    }
}

// wgmma.m64nNk16, K-major A and B through matrix descriptors (128-byte swizzle)
float operand(u64 desc, int row, int k, int bf16) {
    const size_t start = (desc & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
    if ((desc >> 62) != 1 || ((desc >> 49) & 7)) ++errors;   // 128-byte swizzle, base offset 0
    const size_t off = start + (row / 8) * sbo + (row % 8) * 128 + 2 * k;
    const u16* p = (const u16*)(window + (off ^ (((off >> 7) & 7) << 4)));
    if (!in_smem(p, 2)) { ++errors; return 0.0f / 0.0f; }
    return to_f32(*p, bf16);
}
// the operands of one wgmma of a warpgroup, read from shared memory by its first thread
struct Tile { int uses = 0; u64 da = 0, db = 0; std::vector<float> A, B; };
std::map<std::pair<int, int>, Tile> tiles;
void exec(const WgOp& op, int bf16) {
    const int tid = threadIdx.x % 128, w = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    Tile& tl = tiles[{(int)threadIdx.x / 128, op.serial}];
    if (tl.uses == 0) {
        tl.da = op.da; tl.db = op.db;
        tl.A.resize(64 * 16); tl.B.resize(op.n * 16);
        for (int r = 0; r < 64; ++r) for (int k = 0; k < 16; ++k)
            tl.A[r * 16 + k] = operand(op.da, r, k, bf16);
        for (int r = 0; r < op.n; ++r) for (int k = 0; k < 16; ++k)
            tl.B[r * 16 + k] = operand(op.db, r, k, bf16);
    } else if (tl.da != op.da || tl.db != op.db) {
        ++errors;   // the threads of a warpgroup gave different descriptors
    }
    for (int j = 0; j < op.n / 2; ++j) {   // the D-fragment layout (PTX ISA)
        const int row = 16 * w + g + 8 * ((j >> 1) & 1), col = 8 * (j >> 2) + 2 * t + (j & 1);
        double s = 0;
        for (int k = 0; k < 16; ++k) s += (double)tl.A[row * 16 + k] * tl.B[col * 16 + k];
        op.d[j] = (float)((op.scale_d ? (double)op.d[j] : 0.0) + s);
    }
    if (++tl.uses == 128) tiles.erase({(int)threadIdx.x / 128, op.serial});
}
void reset() { bars.clear(); tmas.clear(); tiles.clear(); }
int leftover() {   // copies never landed, wgmmas not run by all 128 threads
    int n = (int)tmas.size() + (int)tiles.size();
    tmas.clear(); tiles.clear();
    return n;
}
int bf16_inputs = 0;
void wgmma(float* d, u64 da, u64 db, int scale_d, int n, int f16) {
    bf16_inputs = !f16;
    WgOp op{d, da, db, scale_d, n, ++cur->wg_serial};
    if (wg_late) cur->wg_open.push_back(op); else exec(op, bf16_inputs);
}
void commit() { cur->wg_groups.push_back(cur->wg_open); cur->wg_open.clear(); }
void wait(int n) {
    auto& gs = cur->wg_groups;
    while ((int)gs.size() > n) {
        for (auto& op : gs.front()) exec(op, bf16_inputs);
        gs.erase(gs.begin());
    }
}
} }  // namespace emu::wg
"""


def _wgmma_helper(n: int):
    regs = ", ".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n // 2))
    return ([f"setp.ne.b32 p, %{n // 2 + 2}, 0;",
             f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.",
             f"{{{regs}}}, %{n // 2}, %{n // 2 + 1}, p, 1, 1, 0, 0;",
             f': {outs} : "l"(da), "l"(db), "r"(accumulate)'],
            f"emu::wg::wgmma(d, da, db, accumulate, {n}, F16);")


WG_HELPERS = {
    "smem_addr": SMEM_ADDR,
    "wgmma_n64": _wgmma_helper(64),
    "wgmma_n128": _wgmma_helper(128),
    "wgmma_n256": _wgmma_helper(256),
    "wgmma_fence": (["wgmma.fence.sync.aligned;"], ""),
    "wgmma_commit": (["wgmma.commit_group.sync.aligned;"], "emu::wg::commit();"),
    "wgmma_wait0": (["wgmma.wait_group.sync.aligned 0;"], "emu::wg::wait(0);"),
    "wgmma_wait1": (["wgmma.wait_group.sync.aligned 1;"], "emu::wg::wait(1);"),
    "fence_operand": (['asm volatile("" : "+f"(x) :: "memory");'], ""),
    "mbar_init": (["mbarrier.init.shared::cta.b64 [%0], %1;",
                   ':: "r"(smem_addr(bar)), "r"(count)'], "emu::wg::mbar_init(bar, count);"),
    "mbar_expect_tx": (["mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;",
                        ':: "r"(smem_addr(bar)), "r"(bytes)'], "emu::wg::expect_tx(bar, bytes);"),
    "mbar_arrive": (["mbarrier.arrive.shared::cta.b64 _, [%0];"], "emu::wg::arrive(bar);"),
    "mbar_wait": (["mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;", "@!done bra WAIT;",
                   ':: "r"(smem_addr(bar)), "r"(parity)'], "emu::wg::mbar_wait(bar, parity);"),
    "ldsm_x4": HELPERS["ldsm_x4"],
    "mma16816": (["mma.sync.aligned.m16n8k16.row.col.f32.",
                  "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};",
                  ': "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), '
                  '"r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)'],
                 "emu::mma16816(c, a, b0, b1, !F16);"),
    "tma_load_2d": (["cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx"
                     "::bytes [%0], [%1, {%2, %3}], [%4];",
                     ':: "r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))'],
                    "emu::wg::tma_load(dst, map, bar, 2, c0, c1, 0, 0);"),
    "tma_load_4d": (["cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx"
                     "::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];",
                     ':: "r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), '
                     '"r"(smem_addr(bar))'],
                    "emu::wg::tma_load(dst, map, bar, 4, c0, c1, c2, c3);"),
}
# statements of the kernel body with no effect in the model (register budgets, proxy fences)
_WG_NOOPS = re.compile(r'asm volatile\("(?:fence\.mbarrier_init\.release\.cluster|setmaxnreg\.'
                       r'(?:dec|inc)\.sync\.aligned\.u32 \d+|fence\.proxy\.tensormap::generic\.'
                       r'acquire\.gpu \[%0\], 128);\\n"[^;]*\);')
_WG_CVT = re.compile(r'asm\("cvt\.rn\.(f16x2|bf16x2)\.f32 %0, %1, %2;\\n"\s*:\s*"=r"\((\w+)\)\s*:'
                     r'\s*"f"\((\w+)\),\s*"f"\((\w+)\)\);')


def wg_emulated_source(src: str) -> str:
    """wgmma_tma.cu with its PTX modelled (raises on a changed or unknown instruction)."""
    if not re.search(r'#if F16\s+#define WG_T "f16"\s+#else\s+#define WG_T "bf16"', src):
        raise ValueError("emulator: WG_T no longer follows F16 (the model converts by F16)")
    for name, (must, body) in WG_HELPERS.items():
        src = _replace_body(src, name, must, body)
    src, n = _WG_CVT.subn(r"\2 = emu::cvt_rn_\1(\3, \4);", src)
    if n != 2:
        raise ValueError(f"emulator: expected the f16x2 and bf16x2 conversions, found {n}")
    src = _WG_NOOPS.sub("/* no effect in the model */;", src)
    src, n = _SHARED.subn(r"\1* \2 = (\1*)emu::smem;", src)
    if n != 1 or src.count('extern "C"') != 1:
        raise ValueError("emulator: expected one extern __shared__ array and one kernel")
    src = src.replace('extern "C"', "")
    left = [ln.strip() for ln in src.splitlines() if re.search(r"\basm\b", ln)]
    if left:
        raise ValueError(f"emulator: inline assembly it does not model: {left}")
    return src


def encode_tensor_map(ptr: int, kind: str, dims, strides_bytes, box) -> bytes:
    """The emulator's stand-in for cuTensorMapEncodeTiled (same arguments as the
    launcher's ``tensor_map``; 128-byte swizzle, zeros out of range)."""
    import struct

    rank = len(dims)
    pad = lambda v, n: list(v) + [0] * (n - len(v))  # noqa: E731
    raw = struct.pack("<QQII5Q4Q5II", 0x70616D74756D65, ptr, rank, 2, *pad(dims, 5),
                      *pad(strides_bytes, 4), *pad(box, 5), 3)
    assert kind in ("bfloat16", "float16") and len(raw) <= 128
    return raw.ljust(128, b"\0")


@dataclass(frozen=True)
class WgSpec:
    cfg: object          # WgmmaConfig
    conv: bool = False
    f16: bool = False
    out_half: bool = False

    def defines(self) -> tuple:
        return self.cfg.validate().defines(CONV=self.conv, F16=self.f16, OUT_HALF=self.out_half)


class WgmmaEmulator:
    """wgmma_tma_kernel compiled for `specs`, run on the CPU. `launch` takes what CuPy
    would be given; the tensor maps must come from `encode_tensor_map`."""

    SMEM_SHIFT = 16   # dynamic shared memory 16 bytes past a 1024-byte boundary

    def __init__(self, specs, workdir=None, sources=None):
        self.specs = list(specs)
        sources = sources or [load_module("wgmma03_gemm_conv_tma").source()] * len(specs)
        parts = [PRELUDE, WG_PRELUDE]
        for i, (s, source) in enumerate(zip(self.specs, sources, strict=True)):
            body, undef = wg_emulated_source(source), _macros(source)
            defs = [d[2:].split("=") for d in s.defines()]
            n_int = len(kernel_scalars(source, "wgmma_tma_kernel", 2))
            parts += [f"#define {k} {v}" for k, v in defs]
            parts += [f"namespace wcfg{i} {{", body, "}"]
            parts += [f"#undef {m}" for m in sorted(undef | {k for k, _ in defs})]
            parts.append(
                f'extern "C" int wrun{i}(const void* maps, void* C, const long long* bnd, '
                f"const int* s, unsigned blocks, unsigned nt, long long smem, int late) {{ "
                f"emu::wg::tma_late = late & 1; emu::wg::wg_late = (late >> 1) & 1; "
                f"emu::on_block = emu::wg::reset; emu::on_block_end = emu::wg::leftover; "
                f"emu::smem_shift = {self.SMEM_SHIFT}; "
                f"int r = emu::run_grid(blocks, 1, nt, smem, bnd, 0, [=] {{ "
                f"wcfg{i}::wgmma_tma_kernel((const wcfg{i}::u64*)maps, C, "
                + ", ".join(f"s[{j}]" for j in range(n_int)) + "); }); "
                "emu::on_block = nullptr; emu::on_block_end = nullptr; emu::smem_shift = 0; "
                "return r; }")
        self.lib = compile_library("\n".join(parts), "wgmma_emulate", workdir)
        self.errors = 0

    def launch(self, i, grid, block, args, shared_mem, operands, late=3) -> None:
        """late: bit 0, TMA copies land only when their barrier is waited on; bit 1,
        wgmma runs at its wait_group instead of at issue."""
        s = self.specs[i]
        if tuple(block) != (s.cfg.threads,) or shared_mem != s.cfg.smem_bytes(s.out_half):
            raise ValueError(f"{s.cfg}: launched with block {block}, {shared_mem} bytes")
        if len(grid) != 1:
            raise ValueError(f"persistent kernel: a 1-D grid, got {grid}")
        ptrs, sc = [int(v) for v in args[:2]], np.array([int(v) for v in args[2:]], np.int32)
        bnd = np.array([v for a in operands for v in (a.ctypes.data, a.ctypes.data + a.nbytes)],
                       np.int64)
        p = ctypes.c_void_p
        self.errors = getattr(self.lib, f"wrun{i}")(
            p(ptrs[0]), p(ptrs[1]), p(bnd.ctypes.data), p(sc.ctypes.data),
            ctypes.c_uint(grid[0]), ctypes.c_uint(s.cfg.threads),
            ctypes.c_longlong(s.cfg.smem_bytes(s.out_half)), ctypes.c_int(late))


# ----------------------------------------------------------------------------------------
# The block rasterization, read out of a kernel's source

def _split_top(text: str, sep: str) -> list:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


def c_ints_to_python(code: str, params, returns, renames=()):
    """Straight-line C on non-negative ints (``const int a = e, b = e;``, ``a = e;``) as a
    Python function of `params` returning `returns`; C's ``/`` is then Python's ``//``."""
    lines = []
    for stmt in re.sub(r"//[^\n]*", "", code).split(";"):
        stmt = stmt.strip()
        if not stmt:
            continue
        stmt = re.sub(r"^(const\s+)?int\s+", "", stmt)
        for decl in _split_top(stmt, ","):
            if "=" not in decl:
                continue          # a declaration without a value
            name, expr = (v.strip() for v in decl.split("=", 1))
            for old, new in renames:
                expr = expr.replace(old, new)
            expr = expr.replace("/", "//")
            if not (re.fullmatch(r"\w+", name) and re.fullmatch(r"[\w\s+\-*/%(),]*", expr)):
                raise ValueError(f"cannot translate `{decl.strip()}` to Python")
            lines.append(f"    {name} = {expr}")
    src = (f"def f({', '.join(params)}):\n" + "\n".join(lines)
           + f"\n    return {', '.join(returns)}\n")
    env = {"min": min, "max": max}
    exec(compile(src, "<kernel lines>", "exec"), env)  # noqa: S102  (the kernel's own lines)
    return env["f"]


def rasterization(source: str):
    """mma_sync.cu's tile -> (block row, column) mapping (the body of ``tile_of``, tile
    ``by * gx + bx`` of a gy x gx grid) as f(bx, by, gx, gy, group_m) -> (bm, bn)."""
    f = c_ints_to_python(function_body(source, "tile_of"), ("bid", "nbn", "nbm", "group_m"),
                         ("bm", "bn"), (("GROUP_M", "group_m"),))
    return lambda bx, by, gx, gy, group_m: f(by * gx + bx, gx, gy, group_m)


def function_body(source: str, name: str) -> str:
    """The text between the braces of the one definition of `name`."""
    hits = list(re.finditer(rf"__device__[^;{{}}]*?\b{name}\s*\(", source))
    if len(hits) != 1:
        raise ValueError(f"expected one definition of {name}, found {len(hits)}")
    start = source.index("{", hits[0].end())
    depth = 0
    for i in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[start + 1:i]
    raise ValueError(f"unbalanced braces in {name}")


def tiles_covered(f, gx: int, gy: int, group_m: int) -> list:
    """(bm, bn) of every block of a gx x gy grid, in launch order."""
    return [f(bx, by, gx, gy, group_m) for by in range(gy) for bx in range(gx)]


# ----------------------------------------------------------------------------------------
# Comparisons with float64 NumPy


def _f64(a, bf16):
    return bf16_to_f64(a) if bf16 else a.astype(np.float64)


def rel_err(out, exp, absref) -> float:
    """Max |out - exp| / (|a| @ |b|); inf if anything is not finite (unwritten, NaN read)."""
    if not np.isfinite(out).all():
        return float("inf")
    return float(np.max(np.abs(out - exp) / (absref + 1e-30)))


def fp16_operands(M, N, K, rng):
    """Random fp16 A (M x K) and B^T (N x K) with their float64 product A @ B^T and
    |A| @ |B|^T, the scale `rel_err` divides by."""
    a = rng.standard_normal((M, K)).astype(np.float16)
    bt = rng.standard_normal((N, K)).astype(np.float16)
    A, B = a.astype(np.float64), bt.astype(np.float64)
    return a, bt, A @ B.T, np.abs(A) @ np.abs(B).T


def gemm_case(em, i, M, N, K, rng, late=True, sms=None) -> float:
    s = em.specs[i]
    a32, b32 = rng.standard_normal((M, K)), rng.standard_normal((N, K))
    a, bt = (to_bf16(a32), to_bf16(b32)) if s.bf16 else (a32.astype(np.float16),
                                                          b32.astype(np.float16))
    out = em.gemm(i, a, bt, late, sms)
    A, B = _f64(a, s.bf16), _f64(bt, s.bf16)
    return rel_err(out, A @ B.T, np.abs(A) @ np.abs(B).T)


def conv_case(em, i, xs, ws, stride, padding, dilation, rng, late=True) -> float:
    """xs (N, C, H, W), ws (K, C, R, S): the kernel on NHWC / KRSC, compared in NCHW."""
    from convlab import reference as ref

    s = em.specs[i]
    x32 = rng.standard_normal(xs).transpose(0, 2, 3, 1).copy()
    w32 = rng.standard_normal(ws).transpose(0, 2, 3, 1).copy()
    x, w = (to_bf16(x32), to_bf16(w32)) if s.bf16 else (x32.astype(np.float16),
                                                          w32.astype(np.float16))
    out = em.conv(i, x, w, stride, padding, dilation, late).transpose(0, 3, 1, 2)
    X, W = (_f64(v, s.bf16).transpose(0, 3, 1, 2) for v in (x, w))
    exp = ref.conv2d(X, W, stride=stride, padding=padding, dilation=dilation)
    absr = ref.conv2d(np.abs(X), np.abs(W), stride=stride, padding=padding, dilation=dilation)
    return rel_err(out, exp, absr)


def tolerance(spec) -> float:
    """fp32 sums of exact products (relative to sum |a||b|); fp16 output rounding."""
    return 2e-3 if spec.out_f16 else 1e-5


def main() -> int:
    """Every ladder step and GEMM candidate, every conv candidate, at their own tiles on
    tiny problems; tiny tiles of each switch combination, fp16 output and bf16 inputs."""
    from dataclasses import replace

    m2 = load_module()
    tiny = [replace(c, BM=32, BN=32, WM=16, WN=16) for c in m2.LADDER.values()]
    gemm = list(dict.fromkeys([*m2.LADDER.values(), *m2.GEMM_CANDIDATES, *tiny]))
    specs = ([Spec(c) for c in gemm]
             + [Spec(c, conv=True) for c in dict.fromkeys([*m2.CONV_CANDIDATES, *tiny])]
             + [Spec(replace(tiny[-1], BK=64, STAGES=3, GROUP_M=2), out_f16=True),
                Spec(tiny[-1], bf16=True)])
    em = Emulator(specs)
    rng = np.random.default_rng(0)
    bad = 0
    for i, s in enumerate(specs):
        for late in (False, True):
            if s.conv:
                cases = [((2, 16, 5, 5), (12, 16, 3, 3), 2, 1, 1),
                         ((2, 16, 7, 6), (10, 16, 3, 2), (1, 2), (2, 0), 2)]
                errs = [conv_case(em, i, *c, rng, late) for c in cases]
            else:
                errs = [gemm_case(em, i, 70, 36, 168, rng, late)]
            ok = max(errs) < tolerance(s) and em.errors == 0 and em.conflicts == 0
            print(f"{'conv' if s.conv else 'gemm'} {s.cfg}{' f16-out' * s.out_f16}"
                  f"{' bf16' * s.bf16} late={int(late)}: max rel err {max(errs):.1e}, "
                  f"faults {em.errors}, bank conflicts {em.conflicts}")
            bad += not ok
    print("ALL OK" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
