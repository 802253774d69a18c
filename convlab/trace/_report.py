"""What a trace says: warp requests, sectors, bank conflicts, reuse, races, pictures."""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np

from ._engine import KINDS, TraceError

SECTOR = 32  # bytes
BANKS = 32   # shared-memory banks of 4 bytes


class Table(list):
    """Rows (dicts) that print as a small aligned table, and as HTML in a notebook."""

    def __init__(self, rows, columns=None, title=None, formats=None):
        super().__init__(rows)
        self.columns = list(columns or (rows[0].keys() if rows else []))
        self.title = title
        self.formats = formats or {}

    def _cell(self, col, v):
        if col in self.formats and v is not None:
            return format(v, self.formats[col])
        if isinstance(v, float):
            return f"{v:.2f}"
        return "" if v is None else str(v)

    def __str__(self):
        if not self:
            return f"{self.title}: (none)" if self.title else "(none)"
        cells = [[self._cell(c, r.get(c)) for c in self.columns] for r in self]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(self.columns)]
        num = [all(_numeric(r[i]) for r in cells) for i in range(len(self.columns))]

        def line(vals):
            return "  ".join(v.rjust(w) if n else v.ljust(w)
                             for v, w, n in zip(vals, widths, num, strict=True)).rstrip()

        out = [self.title] if self.title else []
        out += [line(self.columns), line(["-" * w for w in widths])]
        out += [line(row) for row in cells]
        return "\n".join(out)

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        head = f"<b>{html.escape(self.title)}</b>" if self.title else ""
        if not self:
            return head + " (none)"
        th = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(self._cell(c, r.get(c)))}</td>"
                                        for c in self.columns) + "</tr>" for r in self)
        return f"{head}<table><tr>{th}</tr>{body}</table>"

    def column(self, name) -> list:
        return [r[name] for r in self]

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame(list(self), columns=self.columns)


def _numeric(s: str) -> bool:
    try:
        float(s.rstrip("%x"))
        return True
    except ValueError:
        return s == ""


@dataclass
class Race:
    """Two threads of one block touched one shared address between the same barriers."""

    hazard: str          # "RAW", "WAR" or "WAW"
    array: str
    first: str           # site of the access that comes first in program order
    second: str          # site of the other access
    addresses: int       # distinct shared addresses with this hazard
    kernel: str
    block: tuple
    threads: tuple       # (thread doing `first`, thread doing `second`), linear ids
    index: tuple         # an example element of the shared array
    interval: int        # barrier interval: 0 = before the first cuda.syncthreads()
    barriers: bool = True  # does the kernel call cuda.syncthreads() at all?

    def __str__(self):
        verbs = {"RAW": ("writes", "reads"), "WAR": ("reads", "writes"),
                 "WAW": ("writes", "writes")}[self.hazard]
        where = ("in a kernel without cuda.syncthreads()" if not self.barriers else
                 "before the first cuda.syncthreads()" if self.interval == 0 else
                 f"after cuda.syncthreads() #{self.interval}")
        return (f"shared-memory race ({self.hazard}) on {self.array}{list(self.index)}: thread "
                f"{self.threads[0]} {verbs[0]} it at {self.first}, thread {self.threads[1]} "
                f"{verbs[1]} it at {self.second}, {where} with no barrier in between "
                f"(block {self.block} of {self.kernel}; {self.addresses} such addresses)")


def _group(*cols):
    """Group rows by equal values in all cols: (group id per row, first row per group)."""
    n = len(cols[0])
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort(cols[::-1])
    keys = np.stack([c[order] for c in cols], axis=1)
    new = np.ones(n, bool)
    new[1:] = np.any(keys[1:] != keys[:-1], axis=1)
    gid_sorted = np.cumsum(new) - 1
    gid = np.empty(n, np.int64)
    gid[order] = gid_sorted
    return gid, order[new]


class Trace:
    """The memory accesses of one or more traced kernel launches, and what they mean.

    Made by `convlab.trace.trace_launch`. Arrays are named by the kernel's parameter
    names (``x``, ``w``, ``y``), the launcher's (``out``) also work; shared arrays by the
    variable they are assigned to. Sites are source locations (``line 34: x[n, c, h, col]``)
    and can be given as a number or any unique part of that text.
    """

    def __init__(self, rec, result=None):
        self.launches = rec.launches
        self.arrays = rec.arrays
        self.sites = rec.sites
        self.result = result
        self._r = rec.records()
        self._q = None
        keys = rec.ctx_keys
        rank = np.empty(len(keys), np.int64)
        rank[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
        self._ctx_rank = rank

    # ------------------------------------------------------------------ lookups
    def array(self, name):
        """The ArrayInfo called `name` (kernel parameter, launcher parameter or shared)."""
        if not isinstance(name, str):
            if isinstance(name, (int, np.integer)) and 0 <= name < len(self.arrays):
                return self.arrays[name]
            raise TraceError(f"unknown array {name!r}")
        for a in self.arrays:
            if name == a.name or name in a.aliases:
                return a
        known = ", ".join(a.name + (f" ({'/'.join(a.aliases)})" if a.aliases else "")
                          for a in self.arrays)
        raise TraceError(f"no array called {name!r} in this trace; it has: {known}")

    def site(self, site, kind=None) -> dict:
        """The site dict for a site number or a unique part of its label."""
        if isinstance(site, (int, np.integer)):
            if 0 <= site < len(self.sites):
                return self.sites[site]
            raise TraceError(f"no site {site}; this trace has {len(self.sites)}")
        cands = [s for s in self.sites if (kind is None or s["kind"] == kind) and (
            site in s["label"] or site == s["text"] or site in f"{s['file']}:{s['line']}")]
        exact = [s for s in cands if s["text"] == site]
        if len(exact) == 1:
            return exact[0]
        if len(cands) == 1:
            return cands[0]
        listing = "\n  ".join(f"{s['id']}: {s['label']} ({s['kind']})" for s in self.sites)
        what = "matches several sites" if cands else "matches no site"
        raise TraceError(f"{site!r} {what}; the sites are:\n  {listing}")

    def _space(self):
        return np.array([a.space == "shared" for a in self.arrays] or [False], bool)

    def _kind(self):
        return np.array([KINDS.index(s["kind"]) for s in self.sites] or [0], np.int64)

    # ------------------------------------------------------------------ requests
    def _requests(self) -> dict:
        """One row per warp request, with its sector / bank analysis."""
        if self._q is not None:
            return self._q
        r = self._r
        n = len(r["site"])
        warp = r["tid"] // 32
        req, first = _group(r["launch"], r["block"], warp, r["site"], r["arr"], r["ctx"])
        nreq = len(first)
        q = {k: r[k][first] for k in ("launch", "block", "site", "arr", "ctx")}
        q["warp"] = warp[first]
        q["lanes"] = np.bincount(req, minlength=nreq)
        q["seq"] = np.full(nreq, np.iinfo(np.int64).max)
        np.minimum.at(q["seq"], req, r["seq"])
        q["shared"] = self._space()[q["arr"]] if nreq else np.zeros(0, bool)
        q["kind"] = self._kind()[q["site"]] if nreq else np.zeros(0, np.int64)
        off, size = r["off"], r["size"]
        # global: distinct 32-byte sectors, distinct bytes used
        q["sectors"] = np.zeros(nreq, np.int64)
        q["used"] = np.zeros(nreq, np.int64)
        if n:
            s0, s1 = off // SECTOR, (off + size - 1) // SECTOR
            m = int(max(s1.max(), 0)) + 1
            keys = np.unique(np.concatenate([req * m + s0, req * m + s1]))
            q["sectors"] = np.bincount(keys // m, minlength=nreq)
            mo = int(off.max()) + 1
            keys, idx = np.unique(req * mo + off, return_index=True)
            q["used"] = np.bincount(keys // mo, weights=size[idx], minlength=nreq).astype(
                np.int64)
        q["ideal"] = -(-q["used"] // SECTOR)
        q["requested"] = np.bincount(req, weights=size, minlength=nreq).astype(np.int64)
        # shared: bank conflicts. 4-byte words, bank = word % 32; accesses wider than 4 bytes
        # are split into phases of 128 bytes (half / quarter warps), each one wavefront at best.
        q["wavefronts"] = np.zeros(nreq, np.int64)
        q["phases"] = np.zeros(nreq, np.int64)
        q["ways"] = np.zeros(nreq, np.int64)
        sh = self._space()[r["arr"]] if n else np.zeros(0, bool)
        if sh.any():
            nw = np.maximum(1, size[sh] // 4)
            lane = r["tid"][sh] % 32
            phase = lane // (32 // np.minimum(nw, 32))
            rreq = np.repeat(req[sh], nw)
            rphase = np.repeat(phase, nw)
            start = np.repeat(np.cumsum(nw) - nw, nw)
            words = np.repeat(off[sh] // 4, nw) + (np.arange(int(nw.sum())) - start)
            mw = int(words.max()) + 1
            uniq = np.unique((rreq * 32 + rphase) * mw + words)
            rp, w = uniq // mw, uniq % mw
            bank_keys, counts = np.unique(rp * BANKS + w % BANKS, return_counts=True)
            rp_of_bank = bank_keys // BANKS
            rps, inv = np.unique(rp_of_bank, return_inverse=True)
            per_phase = np.zeros(len(rps), np.int64)
            np.maximum.at(per_phase, inv, counts)
            rq = rps // 32
            q["wavefronts"] = np.bincount(rq, weights=per_phase, minlength=nreq).astype(np.int64)
            q["phases"] = np.bincount(rq, minlength=nreq)
            np.maximum.at(q["ways"], rq, per_phase)
        self._req_of_record = req
        self._q = q
        return q

    def _select(self, shared: bool, kind=None, array=None, site=None):
        q = self._requests()
        m = q["shared"] == shared
        if kind is not None:
            kinds = [kind] if isinstance(kind, str) else list(kind)
            bad = [k for k in kinds if k not in KINDS]
            if bad:
                raise TraceError(f"kind must be one of {KINDS}, got {bad}")
            m &= np.isin(q["kind"], [KINDS.index(k) for k in kinds])
        if array is not None:
            m &= q["arr"] == self.array(array).id
        if site is not None:
            m &= q["site"] == self.site(site)["id"]
        return m

    # ------------------------------------------------------------------ global memory
    def global_stats(self) -> Table:
        """Per (site, array): warp requests, 32-byte sectors per request vs the ideal for
        the bytes used, bytes moved vs bytes used."""
        q = self._requests()
        rows = []
        m = ~q["shared"]
        for s, a in sorted({(int(s), int(a)) for s, a in zip(q["site"][m], q["arr"][m],
                                                               strict=True)}):
            k = m & (q["site"] == s) & (q["arr"] == a)
            nq = int(k.sum())
            moved, used = int(q["sectors"][k].sum()) * SECTOR, int(q["used"][k].sum())
            rows.append(dict(
                kernel=self.sites[s]["kernel"], site=self.sites[s]["label"],
                array=self.arrays[a].name, kind=self.sites[s]["kind"], requests=nq,
                threads_per_req=q["lanes"][k].mean(),
                sectors_per_req=q["sectors"][k].mean(), ideal_per_req=q["ideal"][k].mean(),
                bytes_moved=moved, bytes_used=used, efficiency=used / moved if moved else 0.0))
        cols = ["site", "array", "kind", "requests", "threads_per_req", "sectors_per_req",
                "ideal_per_req", "bytes_moved", "bytes_used", "efficiency"]
        if len({r["kernel"] for r in rows}) > 1:
            cols.insert(0, "kernel")
        return Table(rows, cols, "global memory: 32-byte sectors per warp request",
                     {"efficiency": ".0%", "threads_per_req": ".1f", "sectors_per_req": ".2f",
                      "ideal_per_req": ".2f"})

    def sectors_per_request(self, kind="load", array=None, site=None) -> float:
        """Average number of 32-byte sectors a warp request of global memory touches."""
        m = self._select(False, kind, array, site)
        if not m.any():
            raise TraceError(f"no global {kind} requests" + (f" of {array}" if array else "")
                             + " in this trace")
        return float(self._requests()["sectors"][m].mean())

    def ideal_sectors_per_request(self, kind="load", array=None, site=None) -> float:
        """Average sectors the same requests would need if the bytes used were contiguous."""
        m = self._select(False, kind, array, site)
        if not m.any():
            raise TraceError(f"no global {kind} requests in this trace")
        return float(self._requests()["ideal"][m].mean())

    def efficiency(self, kind="load", array=None, site=None) -> float:
        """Bytes used / bytes moved (32 per sector) over global requests: 1.0 is perfect."""
        m = self._select(False, kind, array, site)
        q = self._requests()
        moved = q["sectors"][m].sum() * SECTOR
        if not moved:
            raise TraceError(f"no global {kind} requests in this trace")
        return float(q["used"][m].sum() / moved)

    def cache_footprint(self, kind="load", array=None) -> dict:
        """Sectors of global memory under three cache assumptions (caches are not
        modelled elsewhere; this brackets what they could do):

        requested: sum over warp requests (no cache: every request goes to memory);
        per_block: distinct sectors each block touches, summed over blocks (an L1 that
        keeps all a block touches); per_launch: distinct sectors of the whole launch
        (an L2 that keeps everything: the compulsory traffic).
        """
        m = self._select(False, kind, array)
        q, r = self._requests(), self._r
        rec = m[self._req_of_record] if len(r["site"]) else np.zeros(0, bool)
        if not rec.any():
            raise TraceError(f"no global {kind} requests in this trace")
        # an access that straddles a sector boundary touches both sectors
        s0, s1 = r["off"][rec] // SECTOR, (r["off"][rec] + r["size"][rec] - 1) // SECTOR
        sec = np.concatenate([s0, s1])
        arr, blk, lau = (np.tile(r[k][rec], 2) for k in ("arr", "block", "launch"))
        ms = int(sec.max()) + 1
        na = len(self.arrays)
        per_launch = len(np.unique((lau * na + arr) * ms + sec))
        nb = int(blk.max()) + 1
        per_block = len(np.unique(((lau * nb + blk) * na + arr) * ms + sec))
        return dict(requested=int(q["sectors"][m].sum()), per_block=per_block,
                    per_launch=per_launch, requests=int(m.sum()))

    def l2_sectors_per_request(self, kind="load", array=None) -> float:
        """Sectors per warp request that leave the SM, i.e. get past L1 to L2/DRAM.

        The model (see the module docstring): for loads, an L1 that keeps every sector
        one thread block touches for the block's lifetime and shares nothing between
        blocks, so a block fetches each distinct sector once: distinct sectors per block,
        summed over blocks, divided by the warp requests (``cache_footprint()`` per_block
        / requests). Stores and atomics are not kept in L1 (write-through): every sector
        of every request goes to L2, so for them this equals `sectors_per_request`.
        Compare `sectors_per_request`, the L1's work per load instruction.
        """
        if kind != "load":
            return self.sectors_per_request(kind, array)
        fp = self.cache_footprint(kind, array)
        return fp["per_block"] / fp["requests"]

    def l2_bytes(self) -> int:
        """Bytes that leave the SMs in the L1 model of `l2_sectors_per_request`: distinct
        load sectors per block plus every store / atomic sector, x 32, all global arrays."""
        total = self.cache_footprint("load")["per_block"] if self._select(
            False, "load").any() else 0
        m = self._select(False, ["store", "atomic"])
        return int((total + self._requests()["sectors"][m].sum()) * SECTOR)

    def conv_flops(self):
        """2 N K P Q C R S for a trace whose arrays x (N, C, H, W), w (K, C, R, S) and an
        output (N, K, P, Q) are 4-D (the course's direct-conv kernels); else None.
        Taps in the padding count, as in `convlab.reference.conv2d_flops`."""
        try:
            x, w = self.array("x").shape, self.array("w").shape
        except TraceError:
            return None
        if len(self.launches) != 1:
            return None
        outs = [a.shape for a in self.arrays if a.space == "global" and len(a.shape) == 4
                and a.name not in ("x", "w") and a.shape[:2] == (x[0], w[0])]
        if len(x) != 4 or len(w) != 4 or len(outs) != 1:
            return None
        n, k, p, q = outs[0]
        return 2 * n * k * p * q * w[1] * w[2] * w[3]

    def _outputs(self, out) -> int:
        a = self.array(out)
        r = self._r
        stores = (r["arr"] == a.id) & np.isin(self._kind()[r["site"]], [1, 2])
        nout = len(np.unique(r["off"][stores]))
        if not nout:
            raise TraceError(f"the kernel never stored to {out!r}")
        return nout

    def loads_per_output(self, out, array=None) -> float:
        """Global loads (one per thread per element) per distinct element stored to `out`.

        array: count loads of this array only (default: every global array).
        """
        r = self._r
        sel = (~self._space()[r["arr"]]) & (self._kind()[r["site"]] == 0)
        if array is not None:
            sel &= r["arr"] == self.array(array).id
        return float(sel.sum() / self._outputs(out))

    def bytes_per_output(self, out, array=None) -> float:
        """Bytes moved from global memory (sectors x 32) by loads, per element of `out`.

        This is what DRAM would deliver if no cache (L1/L2) ever hit.
        """
        m = self._select(False, "load", array)
        return float(self._requests()["sectors"][m].sum() * SECTOR / self._outputs(out))

    def reuse(self, array) -> float:
        """How many times each loaded element of `array` is loaded, on average."""
        a = self.array(array)
        r = self._r
        sel = (r["arr"] == a.id) & (self._kind()[r["site"]] == 0)
        if not sel.any():
            raise TraceError(f"{array!r} is never loaded")
        return float(sel.sum() / len(np.unique(r["off"][sel])))

    def load_counts(self, array, kind="load") -> np.ndarray:
        """How often each element of `array` was accessed (shape of the array)."""
        a = self.array(array)
        r = self._r
        sel = (r["arr"] == a.id) & (self._kind()[r["site"]] == KINDS.index(kind))
        idx = a.element_index(r["off"][sel])
        size = int(np.prod(a.shape))
        return np.bincount(idx[idx >= 0], minlength=size)[:size].reshape(a.shape)

    # ------------------------------------------------------------------ shared memory
    def shared_stats(self, by="site") -> Table:
        """Bank conflicts: n-way degree per request (max distinct 4-byte words that fall
        in one of the 32 banks; the same word for many threads is a broadcast, 1-way).

        by="site": one row per (site, array); by="kernel": one row per kernel.
        """
        q = self._requests()
        m = q["shared"]
        rows = []
        if by == "site":
            for s, a in sorted({(int(s), int(a)) for s, a in zip(q["site"][m], q["arr"][m],
                                                                   strict=True)}):
                k = m & (q["site"] == s) & (q["arr"] == a)
                rows.append(dict(
                    kernel=self.sites[s]["kernel"], site=self.sites[s]["label"],
                    array=self.arrays[a].name, kind=self.sites[s]["kind"],
                    requests=int(k.sum()), threads_per_req=q["lanes"][k].mean(),
                    ways=q["ways"][k].mean(), max_ways=int(q["ways"][k].max()),
                    wavefronts=int(q["wavefronts"][k].sum()),
                    ideal=int(q["phases"][k].sum())))
            cols = ["site", "array", "kind", "requests", "threads_per_req", "ways", "max_ways",
                    "wavefronts", "ideal"]
            if len({r["kernel"] for r in rows}) > 1:
                cols.insert(0, "kernel")
        elif by == "kernel":
            names = [self.launches[int(i)]["kernel"] for i in q["launch"]]
            for kname in dict.fromkeys(names):
                k = m & np.array([nm == kname for nm in names], bool)
                if not k.any():
                    continue
                wf, ideal = int(q["wavefronts"][k].sum()), int(q["phases"][k].sum())
                rows.append(dict(kernel=kname, requests=int(k.sum()), wavefronts=wf,
                                 ideal=ideal, ways=wf / ideal,
                                 max_ways=int(q["ways"][k].max())))
            cols = ["kernel", "requests", "wavefronts", "ideal", "ways", "max_ways"]
        else:
            raise TraceError('by must be "site" or "kernel"')
        return Table(rows, cols, "shared memory: bank conflicts (n-way) per warp request",
                     {"ways": ".2f", "threads_per_req": ".1f"})

    def bank_conflicts(self, kind=None, array=None, site=None) -> float:
        """Average n-way bank-conflict degree of shared-memory requests (1.0 = none)."""
        m = self._select(True, kind, array, site)
        if not m.any():
            raise TraceError("no shared-memory requests" + (f" of {array}" if array else "")
                             + " in this trace")
        q = self._requests()
        return float(q["wavefronts"][m].sum() / q["phases"][m].sum())

    # ------------------------------------------------------------------ races
    def barriers_per_block(self) -> list:
        """(kernel name, block index, cuda.syncthreads() barriers the block passed), for
        every traced block of every launch, in launch order."""
        return [(L["kernel"], tuple(b), n) for L in self.launches
                for b, n in zip(L["blocks"], L.get("block_barriers", []), strict=False)]

    def races(self) -> list:
        """Shared-memory hazards: two threads of one block touch the same shared address
        between the same pair of barriers, at least one of them writing."""
        r = self._r
        sh = self._space()[r["arr"]] if len(r["arr"]) else np.zeros(0, bool)
        if not sh.any():
            return []
        cols = {k: v[sh] for k, v in r.items()}
        kind = self._kind()[cols["site"]]
        gid, _ = _group(cols["launch"], cols["block"], cols["epoch"], cols["arr"], cols["off"])
        ng = int(gid.max()) + 1
        stores = np.bincount(gid, weights=kind == 1, minlength=ng)
        atomics = np.bincount(gid, weights=kind == 2, minlength=ng)
        loads = np.bincount(gid, weights=kind == 0, minlength=ng)
        tg = np.unique(gid * (int(cols["tid"].max()) + 1) + cols["tid"])
        threads = np.bincount(tg // (int(cols["tid"].max()) + 1), minlength=ng)
        cand = (threads >= 2) & ((stores >= 1) | ((atomics >= 1) & (loads >= 1)))
        if not cand.any():
            return []
        keep = cand[gid]
        order = np.lexsort((cols["seq"][keep], gid[keep]))
        g = gid[keep][order]
        c = {k: v[keep][order] for k, v in cols.items()}
        kd = kind[keep][order]
        bounds = np.flatnonzero(np.r_[True, g[1:] != g[:-1], True])
        found: dict = {}
        for b0, b1 in zip(bounds[:-1], bounds[1:], strict=True):
            acc = [(int(kd[i]), int(c["tid"][i]), int(c["seq"][i]), int(c["site"][i]), i)
                   for i in range(b0, b1)]
            pair = _hazard(acc)
            if pair is None:
                continue
            hazard, a, b = pair
            i = a[4]
            key = (int(c["launch"][i]), int(c["arr"][i]), hazard, a[3], b[3])
            if key not in found:
                arr = self.arrays[int(c["arr"][i])]
                flat = int(c["off"][i]) // arr.dtype.itemsize
                index = tuple(int(v) for v in np.unravel_index(
                    flat, arr.shape)) if flat < int(np.prod(arr.shape)) else (flat,)
                launch = self.launches[int(c["launch"][i])]
                found[key] = Race(hazard, arr.name, self.sites[a[3]]["label"],
                                  self.sites[b[3]]["label"], 0, launch["kernel"],
                                  launch["blocks"][int(c["block"][i])], (a[1], b[1]), index,
                                  int(c["epoch"][i]), launch["barriers"])
            found[key].addresses += 1
        return list(found.values())

    # ------------------------------------------------------------------ pictures
    def _request_rows(self, site, warp, block, launch, occurrence, kind=None):
        s = self.site(site, kind) if site is not None else None
        q = self._requests()
        if s is None:
            cnt = np.bincount(q["site"], minlength=len(self.sites))
            s = self.sites[int(np.argmax(cnt))]
        if isinstance(block, tuple):
            block = self.launches[launch]["blocks"].index(block)
        m = (q["site"] == s["id"]) & (q["warp"] == warp) & (q["block"] == block) & (
            q["launch"] == launch)
        reqs = np.flatnonzero(m)
        if not len(reqs):
            raise TraceError(f"warp {warp} of block {block} never executes {s['label']}")
        reqs = reqs[np.argsort(self._ctx_rank[q["ctx"][reqs]], kind="stable")]
        if not 0 <= occurrence < len(reqs):
            raise TraceError(f"{s['label']} runs {len(reqs)} times in this warp; "
                             f"occurrence must be below that")
        rq = int(reqs[occurrence])
        self._requests()
        rows = np.flatnonzero(self._req_of_record == rq)
        return s, rq, rows, len(reqs)

    def plot_warp(self, site=None, warp=0, block=0, launch=0, occurrence=0, ax=None):
        """Picture of one warp request: which threads touch which 32-byte sectors (global)
        or which banks (shared). occurrence picks the n-th execution (loop iteration)."""
        import matplotlib.pyplot as plt

        s, rq, rows, nocc = self._request_rows(site, warp, block, launch, occurrence)
        q, r = self._requests(), self._r
        arr = self.arrays[int(q["arr"][rq])]
        lanes = r["tid"][rows] % 32
        off, size = r["off"][rows], r["size"][rows]
        if ax is None:
            fig, ax = plt.subplots(figsize=(8, 4.2))
        else:
            fig = ax.figure
        if arr.space == "shared":
            words = off // 4
            banks = words % BANKS
            ax.scatter(lanes, banks, s=60, c=(words - words.min()) % 64, cmap="tab20",
                       marker="s", edgecolors="k", linewidths=0.3)
            for ln, b, w in zip(lanes, banks, words, strict=True):
                ax.annotate(str(int(w)), (ln, b), fontsize=5, ha="center", va="center")
            ax.set_ylim(-0.7, BANKS - 0.3)
            ax.set_ylabel("shared-memory bank (4-byte word address mod 32)")
            ways = int(q["ways"][rq])
            title = (f"{arr.name}: {s['label']} ({s['kind']})\nwarp {warp}, block "
                     f"{self.launches[launch]['blocks'][int(q['block'][rq])]}: "
                     f"{len(np.unique(words))} words, "
                     f"{'no conflict' if ways == 1 else f'{ways}-way bank conflict'}")
        else:
            sectors = off // SECTOR
            uniq = np.unique(np.concatenate([sectors, (off + size - 1) // SECTOR]))
            pos = np.searchsorted(uniq, sectors)
            ax.scatter(lanes, pos, s=60, marker="s", c="tab:blue", edgecolors="k",
                       linewidths=0.3)
            ax.set_yticks(range(len(uniq)))
            ax.set_yticklabels([f"{int(u) * SECTOR}" for u in uniq],
                               fontsize=7 if len(uniq) <= 40 else 4)
            ax.set_ylabel(f"32-byte sector of {arr.name} (byte offset)")
            ax.set_ylim(-0.7, max(len(uniq), 4) - 0.3)
            title = (f"{arr.name}: {s['label']} ({s['kind']})\nwarp {warp}: "
                     f"{len(uniq)} sectors for {int(q['used'][rq])} bytes used "
                     f"(ideal {int(q['ideal'][rq])})")
        ax.set_xlim(-0.7, 31.7)
        ax.set_xticks(range(0, 32, 4))
        ax.set_xlabel("thread of the warp (lane)")
        ax.grid(True, alpha=0.3)
        ax.set_title(title + (f", execution {occurrence + 1} of {nocc}" if nocc > 1 else ""),
                     fontsize=9)
        fig.tight_layout()
        return fig

    def heatmap(self, array, kind="load", index=None, ax=None):
        """Picture: how often each element of `array` was loaded (or stored).

        Arrays with more than two dimensions are summed over the leading ones unless
        index picks one slice, e.g. index=(0, 0) for image 0, channel 0 of NCHW.
        """
        import matplotlib.pyplot as plt

        counts = self.load_counts(array, kind)
        lead = counts.shape[:-2]
        label = f"(summed over {'x'.join(map(str, lead))})" if np.prod(lead, dtype=int) > 1 else ""
        if index is not None:
            counts = counts[tuple(index)]
            label = f"index {tuple(index)}"
        while counts.ndim > 2:
            counts = counts.sum(axis=0)
        if counts.ndim == 1:
            counts = counts[None, :]
        if ax is None:
            fig, ax = plt.subplots(figsize=(5, 4))
        else:
            fig = ax.figure
        im = ax.imshow(counts, cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, label=f"{kind}s per element")
        ax.set_title(f"{kind}s of each element of {array} {label}\n(total {int(counts.sum())}, "
                     f"min {int(counts.min())}, max {int(counts.max())})", fontsize=9)
        ax.set_xlabel("column")
        ax.set_ylabel("row")
        fig.tight_layout()
        return fig

    # ------------------------------------------------------------------ text
    def sites_table(self) -> Table:
        q = self._requests()
        rows = []
        for s in self.sites:
            k = q["site"] == s["id"]
            arrs = sorted({self.arrays[int(a)].name for a in q["arr"][k]})
            rows.append(dict(id=s["id"], site=s["label"], kind=s["kind"], array=",".join(arrs),
                             requests=int(k.sum())))
        return Table(rows, ["id", "site", "kind", "array", "requests"], "access sites")

    def summary_text(self) -> str:
        out = []
        for L in self.launches:
            out.append(f"{L['kernel']}: grid {L['grid']}, block {L['block']}: {L['threads']} "
                       f"threads traced" + (" (with barriers)" if L["barriers"] else ""))
        g = self.global_stats()
        out.append(str(g))
        for kind in ("load", "store"):
            m = self._select(False, kind)
            if m.any():
                out.append(f"{kind}s: {self.sectors_per_request(kind):.2f} sectors per request"
                           f" (ideal {self.ideal_sectors_per_request(kind):.2f}), "
                           f"{self.efficiency(kind):.0%} of the bytes moved are used")
        stored = [a for a in self.arrays if a.space == "global" and (
            (self._r["arr"] == a.id) & (self._kind()[self._r["site"]] != 0)).any()]
        if len(stored) == 1 and self._select(False, "load").any():
            o = stored[0].name
            out.append(f"per element of {o}: {self.loads_per_output(o):.2f} global loads, "
                       f"{self.bytes_per_output(o):.1f} bytes moved by loads (no caches)")
        if self._requests()["shared"].any():
            out.append(str(self.shared_stats()))
        races = self.races()
        out.append("shared-memory races: " + ("none" if not races else str(len(races))))
        out += [f"  {rc}" for rc in races[:5]]
        return "\n".join(out)

    def summary(self):
        """Print a short readable report."""
        print(self.summary_text())

    def __str__(self):
        return self.summary_text()

    def _repr_html_(self):
        return f"<pre>{html.escape(self.summary_text())}</pre>"

    def __repr__(self):
        return (f"<Trace: {len(self.launches)} launch(es), {len(self._r['site'])} accesses, "
                f"{len(self.sites)} sites>")


WHICH_PREDICTS = (
    "Which ratio predicts time: if the kernel is memory-bound (few FLOP per after-L1 byte "
    "AND it runs near a memory limit), time follows the after-L1 ratio, the traffic to "
    "L2/DRAM; the raw ratio is the L1's work per load instruction, which costs time only "
    "when L1/load throughput is the limit. If the kernel is not memory-bound (latency- or "
    "issue-bound: many instructions per load, as the naive conv at many channels), neither "
    "predicts time. Coalescing still matters once data reuse moves to shared memory: then "
    "each global element is loaded once per tile, L1 has nothing left to absorb, and the "
    "raw ratio is the traffic.")


@dataclass
class Comparison:
    """Two traces side by side: the L1's work, the traffic after L1, FLOP per byte."""

    table: Table
    raw_ratio: float        # sectors per load request, a / b (L1 work per load instruction)
    l2_ratio: float         # after-L1 sectors per load request, a / b (traffic to L2/DRAM)
    intensity: tuple        # FLOP per after-L1 byte of each traced launch (None: unknown)
    names: tuple

    def text(self) -> str:
        a, b = self.names
        return (f"{self.table}\n{a} / {b}: {self.raw_ratio:.2f}x the sectors per load request "
                f"(L1 work per load instruction), {self.l2_ratio:.2f}x the sectors after L1 "
                f"(traffic to L2/DRAM).\n{WHICH_PREDICTS}")

    def __str__(self):
        return self.text()

    __repr__ = __str__

    def _repr_html_(self):
        return f"<pre>{html.escape(self.text())}</pre>"

    def as_dict(self) -> dict:
        return dict(names=list(self.names), raw_ratio=self.raw_ratio, l2_ratio=self.l2_ratio,
                    intensity=list(self.intensity), rows=[dict(r) for r in self.table])


def compare(a: Trace, b: Trace, names=("a", "b"), array=None, flops=None) -> Comparison:
    """Compare two traced launches (e.g. naive vs coalesced) by two load metrics.

    raw: `sectors_per_request` of global loads, what each load instruction asks of L1;
    after L1: `l2_sectors_per_request`, what leaves the SM (distinct sectors per block).
    array: restrict both metrics to loads of one array (e.g. "x"). flops: the FLOP count
    of each traced launch, a pair or one number for both (default: `Trace.conv_flops`);
    the intensity is FLOP per after-L1 byte (`l2_bytes`, loads and stores) of the
    *traced* launch. Ratios are a / b: above 1 means a makes more memory traffic.
    """
    fl = flops if isinstance(flops, (tuple, list)) else (flops, flops)
    rows = []
    for t, name, f in zip((a, b), names, fl, strict=True):
        f = t.conv_flops() if f is None else f
        lb = t.l2_bytes()
        rows.append(dict(
            trace=name, load_requests=t.cache_footprint("load", array)["requests"],
            sectors_per_req=t.sectors_per_request("load", array),
            l2_sectors_per_req=t.l2_sectors_per_request("load", array),
            ideal_per_req=t.ideal_sectors_per_request("load", array),
            l2_bytes=lb, flop_per_l2_byte=(f / lb if f is not None and lb else None)))
    raw = rows[0]["sectors_per_req"] / rows[1]["sectors_per_req"]
    l2 = rows[0]["l2_sectors_per_req"] / rows[1]["l2_sectors_per_req"]
    what = f" of {array}" if array else ""
    table = Table(rows, list(rows[0]), f"global loads{what}: sectors per warp request, raw "
                  "(L1 work) and after L1 (traffic to L2/DRAM)",
                  {"sectors_per_req": ".2f", "l2_sectors_per_req": ".2f",
                   "ideal_per_req": ".2f", "flop_per_l2_byte": ".2f"})
    return Comparison(table, raw, l2, tuple(r["flop_per_l2_byte"] for r in rows), tuple(names))


def _hazard(acc):
    """A conflicting pair among one address's accesses (sorted by seq), or None.

    acc: (kind, tid, seq, site, row) with kind 0 load, 1 store, 2 atomic. Atomics do not
    race with atomics; everything else by two different threads, one writing, does.
    """
    stores = [a for a in acc if a[0] == 1]
    atomics = [a for a in acc if a[0] == 2]
    loads = [a for a in acc if a[0] == 0]

    def other(items, tid):
        return next((x for x in items if x[1] != tid), None)

    def ordered(hz, a, b):
        first, second = (a, b) if a[2] <= b[2] else (b, a)
        if hz == "RW":
            hz = "RAW" if first[0] != 0 else "WAR"
        return hz, first, second

    if stores:
        s0 = stores[0]
        b = other(stores, s0[1]) or other(atomics, s0[1])
        if b is not None:
            return ordered("WAW", s0, b)
        b = other(loads, s0[1])
        if b is not None:
            return ordered("RW", s0, b)
    if atomics and loads:
        for a in atomics:
            b = other(loads, a[1])
            if b is not None:
                return ordered("RW", a, b)
    return None
