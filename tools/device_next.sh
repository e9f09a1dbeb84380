#!/usr/bin/env bash
# The next session's device calls (written 2026-12-04 21:05). next2 was merged into main at 21:05 after test_tp,
# test_gemm, test_moe, test_consumer and test_torchrun passed on the H200 at 049ded4; still to run on main:
# n2 (ring attention, faults, transport: code unchanged by next2, last passed at af75616), t at world 2, m.
#   run(command="export OUT; TANDEM_COMMIT=<hash> timeout 590 bash tools/device_next.sh n2", carry=[".whl"])
# t1: test_tp.  g: test_gemm and bench gemm (issue 23's 24 shapes, bf16 and FP8, per-configuration times).
# t:  tools/diag/tp_trace.py at worlds 4 and 2 (per-block timelines; variants compared bit for bit).
# m:  MoE fused at world 2: tools/diag/moe_fused.py at the deepseek config (timeline), and bench moe again (the
#     19:07 run had fused 1.06-2.7x slower than 2026-12-03; unfused's two smallest rows too).
# n2: the rest of the GPU suite.
# (tools/device_suite.sh passes its pytest arguments quoted since 21:08: a -k expression works; not run yet.)
# 2026-12-05: the next H200 session builds branch next-device3 (claim + gemm-configs + train; none of it has run on
# a GPU) and follows that branch's copy of this file: parts k1, k2, k3, g, tr, n2 (issue notes of stop 32).
# 2026-12-05 07:00: superseded by branch next-device4 (= next-device3 + the AG+GEMM release fix + the joined RS/AR
# reduction, none of it run; the device went away at 04:55 that session): build it and follow its copy of this
# file, parts d3, d1, d2 first.
# 2026-12-05 14:00: the branches above were lost with the old checkout; claims, the release fix and the join were
# rebuilt and merged into main (claims2). Next on main: c3 (test_tp whole: the emulated-nodes, disagreement,
# out-of-step and pipelined cases have not run with claims and pieces on), then bench tp at worlds 4 and 2
# (c2's bench: the fused column with claims + pieces, for the issue-21 table and the shipped tune table), then
# the cross-node claims (lift the N == 1 gate in ag_gemm_sm90.cu / gemm_rs_sm90.cu and run the emulated nodes).
# 2026-12-05 15:50 (second session): ran on H100s (d0, d2, d3, d4, d5; results in docs/results.md): test_tp's
# remaining cases incl. claims across emulated nodes passed; the fused RS/AR grid is 7/8 of the share at 4+ ranks a
# GPU; bench tp w4/w2 and the tune table are current. Next, in this order:
#   1. branch sched-by-ref (one commit on f22801e: the arrival scheduler points at its schedule in the
#      grid-constant parameters instead of copying it with its DeviceComm; ptxas: AG+GEMM 568-616 B stack and
#      202-282 B spills -> 0, GEMM+RS 848-928 / 778-1968 -> 288-400 / 514-1600; not run): build it, then
#        tools/device_next.sh d5 (the fused GEMM role against the core alone; main's numbers are in
#        docs/results.md) and test_tp; if the GEMM role is faster and the tests pass, merge, then bench tp -n 4/-n 2.
#      If the branch is gone: in kernels/include/tandem/kernels/gemm/arrival_scheduler.hpp make the member
#      `const ArrivalSchedule* arrival_` (= &p.arrival) plus `uint64_t epoch_` (the one field it sets).
#   2. n1 then n2 (the whole GPU suite at main: not run whole since af75616; issue 22 asks before/after);
#   3. GEMM+RS's remaining 288-400 B stack frame (not the scheduler, not the roles: ptxas with the roles
#      __noinline__ still showed it in the kernel body).
# 2026-12-05 18:00 (third session, H100s again): sched-by-ref merged after test_tp passed whole (35) at b03e126;
# bench tp w4/w2 and the tune table are current (08d31dd); the rest of the suite: 42 passed at 562351f, but
# test_transport after its first two cases, test_consumer and test_torchrun were not reached (call time ran out).
# Next, in this order:
#   1. branch rs-swizzle (rebased on main at 1970ff6; not run: pieces of whole swizzle groups, TANDEM_TP_SWIZZLE):
#      build it and run its copy of this file's part e4 (its tests, the swizzle trace, bench tp with the swizzle).
#      If the tests pass, merge; if a swizzle wins, make it the fused RS/AR default (or a tune-table column).
#   2. the GPU suite's unreached files: tests/gpu/test_transport.py test_consumer.py test_torchrun.py -- and,
#      since main now carries issue 22's leftovers (5fcac0c, 666a587, b07b255, 1970ff6: SASS identical for every
#      kernel they touch; the Python input checks and binding checks are new code), the whole suite once on main
#      (issue 22 asks for it on the H200 before and after).
#   3. branch moe-finish (e4dc0ea, on 1970ff6; not run: MoE's finish through runtime::finish_block, the combine
#      kernels' SASS changed): test_moe, then merge.
#   4. branch fp8-ag (b7285ab; not run: tandem.ops.scaled_ag_gemm, FP8 AG+GEMM's unfused path, issue 23):
#      bash tools/device_suite.sh tests/gpu/test_tp.py -k fp8, then merge.
#   5. branch tp-train (a28b29f; not run: the TP ops' autograd and tandem.nn, issue 24): its part e5.
#   6. issue 21's remaining rows (docs/results.md "Where issue 21 stands"), then issues 22-26.
# 2026-12-05 20:21 (fourth session, the H200): the four branches above, the wgrad overlap and the split-K GEMM
# configurations were merged (main d7e5bea) after the whole GPU suite passed there (120: f1, f2 and two
# device_suite calls; docs/results.md). Not done and next, in this order:
#   1. rs-swizzle's measurements (its tests passed, its trace and bench did not run): part e4's trace and bench
#      (TRACE_S/BENCH_S), then make a winning swizzle the fused RS/AR default or a tune-table column (issue 21).
#   2. bench gemm again: the op with the rebuilt table (gemm_tune_h200.json, split configurations in it), and why
#      the op runs 8-21 % slower than the same configuration called directly (docs/results.md) (issue 23).
#   3. bench train -n 4 and -n 2 with more repetitions (--reps 7): the wgrad overlap's effect (issue 24).
# Next session, in this order (each one call; the start of a machine costs 75-450 s of the budget):
#   1. k1 on branch integ2 = main + the four unrun branches (fp8-configs, ring-bwd, moe-ffn, rs-stream-loads;
#        git checkout -b integ2 main && git merge fp8-configs ring-bwd moe-ffn rs-stream-loads
#      they merge cleanly; if the branches are gone, tools/pending/*.diff): their tests, the grouped_mm probe, the
#      GEMM host-path diagnostic, then bench gemm / attention w1 / tp --fp8. Merge each branch whose tests pass.
#      (Per branch instead: h1 fp8-configs, r1 ring-bwd, m1 moe-ffn incl. bench moe --layer.)
#   2. b22 (issue 22's benchmarks after, to compare with af75616): then issue 22 can be resolved if within noise.
#   3. s1 (rs-stream-loads, a build option: the trace without and with it; issue 21), e4 (rs-swizzle's trace and
#      bench, issue 21), then bench train -n 4 and -n 2 with --reps 7 (issue 24).
# 2026-12-05 22:58 (sixth session, an H100): k1 ran; fp8-configs, ring-bwd, moe-ffn and rs-stream-loads merged
# (261225c) after their 32 tests passed. The machine was then taken back, and no other was lent (the budget went on
# refusals). Next session, in this order:
#   1. z1 on branch integ3 = main + ring-bwd-cudnn + fp8-cublaslt + moe-grad (they merge cleanly). integ3 is
#      committed (2026-12-06 00:13), and .carry/prebuilt holds tandem._C built here from its native sources
#      (tools/prebuild_device_module.sh; device_suite.sh uses it when tools/native_sources_hash.sh matches
#      .carry/prebuilt/SOURCES, so Python/test/doc changes keep it valid), and the device skips its ~160 s build:
#        git checkout integ3 && bash tools/native_sources_hash.sh; cat .carry/prebuilt/SOURCES   # equal?
#        run(command="export OUT; TANDEM_COMMIT=$(git rev-parse --short HEAD) CALL_S=580 timeout 590 bash tools/device_next.sh z1",
#            carry=[".whl", ".carry/prebuilt"])
#      On an H200, the next call is b22 (issue 22's benchmarks after, to compare with af75616's; resolve issue 22
#      if within noise); on an H100, s1 / e4 below.
#      (branch gone: git checkout -b integ3 main && git merge ring-bwd-cudnn fp8-cublaslt moe-grad, or apply
#      tools/pending/*.diff; .carry gone or the hashes differ: bash tools/prebuild_device_module.sh, ~10 min here.)
#      Merge each branch whose tests pass.
#   2. g2 (bench gemm: FP8 with every configuration, bf16 op with the rebuilt table; issue 23's ratios).
#   3. s1 (rs-stream-loads' trace with and without), e4 (rs-swizzle), bench train -n 4 / -n 2 --reps 7.
# 2026-12-06 02:31 (eighth session, an H100 again): z1 passed (31 + 29 more of test_moe / test_ring_attention);
# ring-bwd-cudnn, fp8-cublaslt and moe-grad merged (65976f3); g2 and the benches ran (docs/results.md, fb3158b).
# NOTE: on the device `git rev-parse` answers a stale HEAD (1919500 all session): pass the commit as a literal,
#   run(command="export OUT; TANDEM_COMMIT=<the hash from here> CALL_S=580 timeout 590 bash tools/device_next.sh <part>", ...)
# Next session, in this order:
#   1. b22x (issue 22's benchmarks before = af75616 and after = this tree, on one machine in one call, any card;
#      .carry/before holds af75616's python/ with its module, tools/prebuild_before.sh): resolve 22 if within noise.
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=580 timeout 590 bash tools/device_next.sh b22x",
#            carry=[".whl", ".carry/prebuilt", ".carry/before"])
#   2. z2 on branch integ4 (= main + fp8-tiles + moe-speed; their tests and measurements in one call). The modules
#      prebuilt here for Python 3.12 are .carry/prebuilt-{main,integ4,moe-speed}; put the branch's in place, check
#      the hashes, then call:
#        git checkout integ4 && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-integ4 .carry/prebuilt
#        bash tools/native_sources_hash.sh; cat .carry/prebuilt/SOURCES     # equal? (else the device builds, ~160 s)
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=580 timeout 590 bash tools/device_next.sh z2",
#            carry=[".whl", ".carry/prebuilt"])
#      Merge fp8-tiles / moe-speed if their tests pass; make the torch GEMM 1 the default if g1t beats new.
#      (Each branch alone: f8 on fp8-tiles, m3 on moe-speed.) Back on main: cp -r .carry/prebuilt-main .carry/prebuilt.
#      After fp8-tiles: python -m tandem tune gemm --from-bench <the FP8 bench JSON> --out
#      python/tandem/ops/gemm_tune_<h100|h200>.json, then time the op with the table.
#   2b. r2 on integ4 too (ring-bwd-merge, merged into integ4: one block call a ring step; the gradient tests, bench
#      attention's causal shapes), same checkout and module as z2.
#   3. The ops with the H100 tables (gemm_tune_h100.json, tp_tune_h100.json, shipped 2026-12-06, not timed):
#      bench gemm --no-variants and bench tp -n 4 / -n 2 on an H100.
#   4. m2 on main (moe_ffn's steps, if integ4's z2 did not run).
#   5. s1 (rs-stream-loads' trace).
# 2026-12-06 04:40 (tenth session, H100s): b22x, z2, r2, the ops with the H100 tables and b22m ran; fp8-tiles,
# moe-speed and ring-bwd-merge merged (e5a5065) after 44 tests passed; gemm_tune_h100.json's FP8 rows rebuilt with
# the 128x192 tiles (dba7023; the op with it not timed). Issue 22's benchmarks before/after are within noise
# (docs/results.md). Next session, in this order:
#   1. Issue 22's leftovers on branch i22 (= main + i22-py + i22-kernels; CPU-tested, not run): the whole GPU
#      suite in three calls, i1, i2, i3 (i3 ends with bench tp -n 4 before/after and test_consumer):
#        git checkout i22 && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-i22 .carry/prebuilt
#        bash tools/native_sources_hash.sh; cat .carry/prebuilt/SOURCES      # equal?
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=580 timeout 590 bash tools/device_next.sh i1",
#            carry=[".whl", ".carry/prebuilt", ".carry/before"])          # then i2, i3
#      If all pass: merge i22 into main and resolve issue 22 (the suite passed before at af75616 on the H200;
#      benchmarks: docs/results.md 2026-12-06). Branch gone: git checkout -b i22 f298404 && git apply tools/pending/i22.diff.
#   2. Branch gemm-clusters (issue 23; bf16 coop_128x256_c1x2 / coop_256x128_c2, no per-call workspace where the
#      kernel needs none): its module is .carry/prebuilt-gemm-clusters (sources ceceab3; copy it to .carry/prebuilt
#      after git checkout gemm-clusters; the hashes must match), part g3; then
#      python -m tandem tune gemm --from-bench <its bf16 JSON> --out python/tandem/ops/gemm_tune_h100.json, and
#      bench gemm --no-variants (the op with the rebuilt bf16 and FP8 tables; neither timed as the op yet).
#   3. Branch ag-ce (issue 21; the unfused AG's gather ran 1.5-4.6x slower than torch's copies): part agce (no
#      native change: main's module). If "one" wins at a shape, make it a pipelined variant the tune table picks.
#   (Both add a part at the same place in this file: merging both conflicts there only.)
#   Budget: a machine start cost 90-390 s of the 1,800 s here; i1-i3 take up to 3 x 580 s. If the start is slow,
#   run i1 and i2, and i3 first thing the session after (i3 alone needs .carry/before for its before/after bench).
# 2026-12-06 07:00 (eleventh session, one H100): i1, i2, i3 ran on i22 (suite passed but test_torchrun, which the
# time cap cut off; the pipelined test's KeyError was a test bug, fixed); i22 merged; agce (not merged: "one" wins
# nowhere) and g3 (gemm-clusters: tests passed, merged, bf16 table rebuilt) ran. Next session, in this order:
#   1. i4 on main (.carry/prebuilt = main's module, .carry/before): bench moe before/after (the MoE kernels' SASS
#      changed in i22), the op with the rebuilt bf16 table, the host path, cuBLAS's kernels. If moe is within
#      noise: resolve issue 22 (test_torchrun passed at 07:38 on be47190, the rest of the suite in i1-i3).
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=580 timeout 590 bash tools/device_next.sh i4",
#            carry=[".whl", ".carry/prebuilt", ".carry/before"])
#   2. gs on branch gemm-sched (issue 23: swizzle x raster per shape in the table; .carry/prebuilt-gs): test_gemm,
#      bench gemm bf16 with schedules, the tuned table, the op with it. If a schedule wins: ship its rows
#      (tune gemm --from-bench ... --out python/tandem/ops/gemm_tune_h100.json) and merge. Then gs8 (its FP8
#      schedules at six shapes) in the same checkout:
#        git checkout gemm-sched && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-gs .carry/prebuilt
#        (SOURCES 2da3b4a = tools/native_sources_hash.sh there), carry [".whl", ".carry/prebuilt"]
#      Branch gone: git checkout -b gemm-sched 0be6034 && git apply tools/pending/gemm-sched.diff.
#   3. mc on branch moe-combine-claims (issue 26 item 3: the combine's rows claimed, not shared out; module
#      .carry/prebuilt-mc): test_moe whole with the late-block test, then bench moe -n 2 (against i4's after side).
#      If all pass: merge. Branch gone: git checkout -b moe-combine-claims 0be6034 &&
#      git apply tools/pending/moe-combine-claims.diff.
#   Budget: i4 + gs + mc + gs8 is about 580 + 580 + 300 + 300 s of device time besides the machine's start: if the
#   start is slow, leave gs8 for the session after.
#   Run parts that use a prebuilt module before anything that pip-installs tandem (test_consumer does): an
#   installed package makes device_suite.sh build (g3 built for 131 s after i3's test_consumer on the same machine).
# 2026-12-06 09:50 (twelfth session, H100s): i4 (issue 22's bench moe before/after: fused 0.805, unfused 0.882 ->
# issue 22 resolved), gs / gs8 / gs8a (gemm-sched: merged, table with schedules), mc (moe-combine-claims: merged),
# hp (host-path: merged; the op's remaining host time is Python), sw (gemm-swap: swap_coop_256x128_c1 merged and
# tabled, the 128x208 swap dropped for its 64x16 atoms). Next session, in this order:
#   1. nx on branch integ-next (= launch-fixes + gemm-swap208 + the GEMM ops' per-call addresses on a copy of the
#      prepared Args (a thread race) and its two-thread test; none of it run; module .carry/prebuilt-next, SOURCES
#      b140709): the launch paths' tests (every kernel family), the host path, the 128x208 swapped tile's bench at
#      the worst shapes and ncu at 777x4104x4096:
#        git checkout integ-next && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-next .carry/prebuilt
#        run(command="export OUT; TANDEM_COMMIT=bb4ac84 CALL_S=560 timeout 570 bash tools/device_next.sh nx",
#            carry=[".whl", ".carry/prebuilt"])
#      Tests green: merge integ-next. If swap_coop_208x128_c2 beats coop_128x256_c1 at 777x4104x4096
#      (0.067-0.072 ms; cuBLAS 0.038): a full bf16 sweep (part sw) and the table rebuilt from it (with
#      docs/results/gemm_sched/fp8_schedules.json for the FP8 rows). Branches gone: git checkout -b integ-next
#      7123926 && git apply tools/pending/integ-next.diff (launch-fixes.diff / gemm-swap208.diff hold the halves).
#   2. the whole GPU suite on main (n1 / i1-i3 style; not run whole since be47190: host-path changed every
#      kernel's launch, gemm-swap the GEMM core's header; their tests above passed).
#   3. issue 23's op host path: a C++ registration of tandem::gemm / scaled_gemm for the CUDA key (the Python op
#      costs 31 us a call against cuBLAS's 20 on the same host, docs/results.md "the launches' host path").
#   CI here: run `CI=true bash .ci/run` in the foreground of a bash call (it finishes in about 5-15 min and the tool
#   backgrounds it itself). Started as `(CI=true nohup bash .ci/run > log 2>&1 &)` it failed two launcher-signal
#   tests (SIGINT / signal redelivery, 30-60 s timeouts) three times on 2026-12-06, while the same tree passed in the
#   foreground (309 passed, 140 skipped) and the two tests pass alone in 5 s; the cause was not established (a
#   guess: SIGINT ignored in asynchronous commands of a non-interactive shell).
# 2026-12-06 12:20 (thirteenth session, one H100 each call): nx + sw2 (integ-next merged, bf16 table rebuilt with the
# 208 swap), to (torch-ops: the GEMM ops' C++ dispatcher kernels; merged: bf16 op 1.014 of cuBLAS), n1 and the rest
# of the suite but test_consumer / test_torchrun (122 passed). Next session, in this order:
#   0. A new checkout has no .whl, .carry, cmake >= 3.26 or torch for python3.12: bash tools/fetch_device_wheels.sh;
#      pip install cmake nvidia-cutlass==4.2.0.0 pybind11; python3.12 -m pip install torch==2.13.0 pytest
#      pytest-timeout numpy (a CUDA build, ~3 GB; the local CPU tests import it); bash tools/prebuild_device_module.sh
#      (a full build: ~20-25 min on 2 cores; run it in a git worktree so branch switches here do not disturb it).
#   1. f8 on branch fp8-overlap (git checkout -b fp8-overlap ce4ff72 && git apply tools/pending/fp8-overlap.diff):
#      its module (prebuild, SOURCES 7db8fd2) and the before side: in the same build dir,
#      TANDEM_PREBUILD_CMAKE_ARGS=-DTANDEM_FP8_OVERLAPPED_PROMOTION=OFF bash tools/prebuild_device_module.sh (only
#      scaled_gemm_sm90.cu recompiles, ~2 min; SASS-identical to main's), copy that .so into .carry/before-f8 =
#      `git archive main python` + COMMIT, then build ON again for .carry/prebuilt.
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=560 timeout 570 bash tools/device_next.sh f8",
#            carry=[".whl", ".carry/prebuilt", ".carry/before-f8"])
#      Tests green and FP8 faster: merge; the FP8 table rows from its sweep (tune gemm --from-bench
#      docs/results/gemm_swap208/sweep_bf16.json <f8 sweep gemm_w1.json>).
#   1b. tf on branch torch-ops-fixes (git checkout -b torch-ops-fixes 2dee16d && git apply
#      tools/pending/torch-ops-fixes.diff; it touches launch_table.cc: its own module): test_gemm whole and the host
#      path; merge if green. It and fp8-overlap both add a part before "to" in this file: merging both conflicts
#      there only.
#   2. test_consumer and test_torchrun on main (n2's last two files; not run since be47190).
#   3. issue 21 (fused TP ops <= naive), then 24-26.
# 2026-12-06 14:30 (fourteenth session, H100s GPU-0ba23669 / GPU-fbd77506): f8 and tf ran, fp8-overlap and
# torch-ops-fixes merged; test_torchrun (2) and test_consumer (6) passed; ag-cluster1 (1-CTA clusters for the fused
# AG+GEMM) ran: tests passed but slower and the same late blocks -> not merged (tools/pending/ag-cluster1.diff).
# device_suite.sh ran every bench after any test selection unless TANDEM_BENCH=0 (a whole budget went on it);
# since 451b5bd it benches only after the whole suite (no arguments, tests or tests/gpu) or with TANDEM_BENCH=1.
# Next session, in this order:
#   1. res on main (issue 21): the residency probe at several grid sizes (which SMs the first wave and the late
#      blocks get: a GPC-sized first wave of 18 SMs at world 4 would point at MPS placing a client's blocks by
#      GPC), and the core's configurations against cuBLAS on the AG+GEMM rank GEMMs on a 32-SM share:
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=420 timeout 430 bash tools/device_next.sh res",
#            carry=[".whl", ".carry/prebuilt"])     (.carry/prebuilt = main's module; SOURCES must match)
#   2. agt on branch ag-tiles (the fused GEMM roles in 256x128 tiles; module .carry/prebuilt-ag-tiles, or build:
#      git checkout ag-tiles && bash tools/prebuild_device_module.sh; branch gone: git checkout -b ag-tiles a6b7bb8
#      && git apply tools/pending/ag-tiles.diff): its tests and tp_trace with both tiles at worlds 4 and 2. Merge
#      if its tests pass and 256x128 is faster for an op (AG+GEMM, GEMM+RS/AR: both are in the branch; a tune-table
#      column or the default under MPS). If res shows another configuration faster per SM, instantiate that one.
#   3. FP8 (issue 23): bench gemm --dtypes fp8_tensor,fp8_row --schedules 2 whole (the 14:00 sweep covered 14 of 24
#      shapes), then tune gemm --from-bench <bf16 sweep> <that JSON>; and tools/diag/cublas_kernels.py --fp8 at the
#      shapes below 0.90 (which tile/cluster cuBLASLt runs where the 128x192 configurations lose).
#   4. On an H200 if one is lent: issue 23's sweep and the GPU suite there (every number so far is from H100s).
#   4b. branch fp8-split (the 128x192 FP8 configurations' promotion overlapped by half-tile batches): first make
#      ptxas stop serializing its wgmmas (C7514, see the header of sm90_fp8_overlapped_promotion.hpp), then part f8s
#      with .carry/before-f8s (main's python and module at b35971a).
#   5. ra on branch gemm-run-at (a host-side refactor of the GEMM ops' launches; git apply tools/pending/gemm-run-at.diff
#      on 026368a if the branch is gone): test_gemm whole and the host path; merge if green.
# 2026-12-06 17:45 (fifteenth session; H100 GPU-4085bcaa, 16:53-17:12, after seven refused starts): ovs on main
# (the residency probe: one rank of four starts on 18 of its 32 SMs in every launch, 1- or 2-CTA clusters alike;
# grids above the share do not help; the core on the share 1.01-1.08x cuBLAS), agt (ag-tiles' 22 tests passed;
# merged as an option), the FP8 sweep and the FP8 table rebuilt from it (op geomeans met, lowest not).
# Next session, in this order:
#   1. share on main (issue 21): the residency probe at launcher shares 20-24 % (which share fits four ranks at
#      once), then tp_trace and bench tp (fused against naive, both at that share; SHARE_PCT=<pct> picks it):
#        run(command="export OUT; TANDEM_COMMIT=<hash> SHARE_PCT=21 CALL_S=560 timeout 570 bash tools/device_next.sh share",
#            carry=[".whl", ".carry/prebuilt"])     (.carry/prebuilt = main's module: SOURCES must equal
#                                                            tools/native_sources_hash.sh; 102b35e at d4e8922)
#      The call also runs main's changes since the 16:53 run for the first time (9e19570: every fused variant
#      preloaded; e756288: the peer monitor counts a refusal before closing): add test_tp -k "256x128 or claims"
#      and test_transport to it, or run the whole GPU suite when the budget allows.
#      If a share has no late rank and fused gains, make it the launcher's default for 4 ranks a GPU
#      (tandem/launch.py _DEFAULT_PERCENT) and rerun bench tp at worlds 4 and 2 (tp_w4/tp_w2.json).
#   1b. fp8m on main (issue 23, ~4 min): the FP8 table from two sweeps' medians against the shipped one; ship it if
#      its lowest shape is higher in both runs (cp docs/results/gemm_fp8_table/table_median_candidate.json
#      python/tandem/ops/gemm_tune_h100.json, and add docs/results/gemm_fp8_overlap/sweep_partial.json to the
#      sweeps of tests/cpu/test_gemm_plan.py::test_the_shipped_h100_table_is_what_tune_makes_from_the_sweeps...).
#   2. rss on branch rs-staged (the GEMM+RS reduce role's loads staged through shared memory: world 2, c=2 took
#      9.4 ms against the core's 1.74): module .carry/prebuilt-rs-staged if built (else build it there).
#   3. fp8-split (C7514 gone since bbfae21; main merged in at 620c705): part f8s, with .carry/prebuilt-fp8-split as
#      .carry/prebuilt and .carry/before-f8s = main at 967ea83 (python + module); carry both (60 MB with .whl).
#   4. ra on gemm-run-at; an H200 if one is lent (issue 23's sweep and the GPU suite).
# 2026-12-06 19:55 (sixteenth session; H100s GPU-5d621938 18:49 and GPU-6cfb2a94 19:02-19:12; the budget went on
# three refused starts and the calls below): share (22 % is the share with every rank resident; a smaller share
# does not change fused/naive), rss (rs-staged's 25 tests passed; faster at world 2 where the reduction leads,
# slower with 4 ranks a GPU), fp8m (median table not shipped), f8s (fp8-split's 13 tests passed; FP8 op 1.118 /
# 1.042 of _scaled_mm, lowest 0.923 / 0.927: merged). Next session, in this order:
#   1. ring on branch rs-ring (issue 21; not run: the fused GEMM+RS and two-shot GEMM+AR with the reduction in the
#      GEMM epilogues, no reduce role; docs/fused-kernels.md): module .carry/prebuilt-rs-ring (SOURCES caa0332 =
#      tools/native_sources_hash.sh there; else build it: bash tools/prebuild_device_module.sh in a worktree):
#        git checkout rs-ring && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-rs-ring .carry/prebuilt
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=560 timeout 570 bash tools/device_next.sh ring",
#            carry=[".whl", ".carry/prebuilt"])
#      Test green and the ring faster than the default fused GEMM+RS: merge (the knob's default per the numbers),
#      then the ring for GEMM+AR (an all-gather of the reduced chunks after the last step) and pieces.
#      Branch gone: git checkout -b rs-ring e1c6750 && git apply tools/pending/rs-ring.diff.
#   2. tps on branch rs-staged (its counter fix 318e854 is not run; module .carry/prebuilt-rs-staged, SOURCES
#      428488b): the staged test and bench tp. Merge if green (default per the numbers: slower with 4 ranks a GPU).
#   3. The whole GPU suite on main (fp8-split merged since the last whole run; test_transport has not run since
#      e756288), and on an H200 if one is lent: issue 23's sweep (the FP8 table with fp8-split: its sweep covered
#      14 of 24 shapes, docs/results/fp8_split/sweep_partial.json).
#   4. ra on gemm-run-at.
# 2026-12-06 23:10 (seventeenth session, 21:10-00:10): no machine started in 14 tries (every refusal cost 90 s of
# device time, the rest "none asked" waits); nothing ran. A fourth review of rs-ring found a stall (the ring with the
# static stride: finished blocks wait on their SMs for blocks of the same grid under MPS) and a flag that could go
# back (one ring_step word for every step): fixed on rs-ring (13b13a4, not run), module .carry/prebuilt-rs-ring2
# (SOURCES 974713f at e90ecde, main merged in; .carry/prebuilt-rs-ring is the old one, stale). Next session, in this order:
#   1. ring (or rings, the same cut to ~300 s) on branch rs-ring, module .carry/prebuilt-rs-ring2:
#        git checkout --detach rs-ring && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-rs-ring2 .carry/prebuilt
#        bash tools/native_sources_hash.sh; cat .carry/prebuilt/SOURCES      # equal?
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=560 timeout 570 bash tools/device_next.sh ring",
#            carry=[".whl", ".carry/prebuilt"])
#      rs-ring has main merged in (e90ecde; main's later commits touch tools/ only), so the merge is clean and
#      its native sources stay rs-ring's (the module stays valid). Green and faster: merge, the knob's default per
#      the numbers.
#   2-4 as in the 19:55 entry above (tps, the whole GPU suite on main, ra).
# 2026-12-07 01:20 (eighteenth session, 23:59-): after 4 refused starts an H100 came at 00:18 (nvidia-h100-x1 named).
# ring ran on rs-ring e90ecde: test_tp whole 55 passed; the rest of the suite 70 passed (test_consumer 6 errors: run
# on the prebuilt module, which has no CMake package -- device_suite.sh now takes the usual build when the selection
# may include test_consumer; test_transport cut after 2 cases); bench tp --ring at worlds 2, 3, 4: ring/fused
# 0.66-0.90 at worlds 3-4, 1.01-1.97 at world 2, ring/unfused 0.99-1.54 (docs/results.md). rs-ring merged into main,
# knob off by default. Since then on main (CPU-tested only): the fused kernels' protocol knobs are part of the ranks'
# agreement key; bench train's "naive compute only" column. main's module is .carry/prebuilt-main (SOURCES 9ca0090,
# built from 94192e2; valid for main's tip and for bwd-gqa, whose native sources are main's). Next session, in
# this order:
#   0. gq on branch bwd-gqa (issue 25: the backward's GQA/MQA blocks to cuDNN natively; not run; the worst bwd rows,
#      0.40-0.65 of SDPA cuDNN, are all GQA/MQA): git checkout --detach bwd-gqa (module as below), part gq; if the
#      gradient test passes and native is faster than repeat, merge.
#   1. tc on main (test_transport whole, not run since e756288; test_consumer with the usual build, ~160 s):
#        git checkout main && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-main .carry/prebuilt
#        run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=560 timeout 570 bash tools/device_next.sh tc",
#            carry=[".whl", ".carry/prebuilt"])
#      (test_tp too if time is left: the knobs' agreement changed the TP ops' Python path, CPU-tested only)
#   1b. abk on main or bwd-gqa (tools/diag/attn_bwd_kernels.py: which kernels the world-1 backward runs beside
#      SDPA's cuDNN backward; ~1-2 min).
#   1c. ao on branch attn-ostore (issue 25: the forward's O stored in 16-byte chunks by a quad transpose; not run):
#        git checkout --detach attn-ostore && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-attn-ostore .carry/prebuilt
#        run(... "bash tools/device_next.sh ao", carry=[".whl", ".carry/prebuilt", ".carry/before-main"])  (~62 MiB)
#      .carry/before-main = main's python/ with its module (the same-call before side). Faster and green: merge.
#   1d. mcl on branch moe-claims (issue 26 item 3: the MoE dispatch as claimed work; compiled, reviewed, not run):
#        git checkout --detach moe-claims && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-moe-claims .carry/prebuilt
#        run(... "bash tools/device_next.sh mcl", carry=[".whl", ".carry/prebuilt", ".carry/before-main"])
#      test_moe whole (with the new late-block dispatch test), bench moe -n 2 before/after. Green: merge.
#   (bwd-gqa, attn-ostore and moe-claims have main merged in up to 2026-12-07 01:45; modules: prebuilt-main serves
#   bwd-gqa, prebuilt-attn-ostore and prebuilt-moe-claims their branches: check SOURCES == native_sources_hash.)
#   2. rt on main: the ring traced on the op's own grid (28 SMs at world 4: every rank resident) -- does a step
#      then cost its share of the core + 10-20 %, and the ring beat unfused? (per-tile flags next if so)
#   3. trc on main (issue 24): bench train with "naive compute only" (naive without its exchanges): the overlap
#      ceiling naive / compute-only, to show whether 1.15 is reachable here at cuBLAS's GEMM speed.
#   4. tps on rs-staged, issue 23's FP8 sweep on an H200, ra on gemm-run-at (as in the 19:55 entry).
# 2026-12-07 05:15 (nineteenth session, 02:45-05:45): no device call ran -- 13 starts refused (90 s each) while other
# sessions held every machine. Built, not run: branch rs-ticket (issue 21: GEMM+RS / two-shot GEMM+AR by tickets,
# TANDEM_RS_TICKET=1, off; each tile's last rank to finish it adds every rank's partial in the tile scheduler's
# fixup, no waits in the GEMM; tools/pending/rs-ticket.diff), and integ-tk = rs-ticket + bwd-gqa (native sources
# = rs-ticket's: one module, .carry/prebuilt-rs-ticket, SOURCES 35e2b3d, serves both). Next session, in this order:
#   1. tk on integ-tk (git checkout --detach integ-tk; rm -rf .carry/prebuilt; cp -r .carry/prebuilt-rs-ticket
#      .carry/prebuilt): the ticket test at worlds 2-4 (late clusters, the same bits whichever rank is late), bench
#      tp --ticket at worlds 4, 2, 3, a trace. Green and faster than unfused: merge rs-ticket, then make it the fused
#      RS/AR default where it wins (auto plan / tune table) and rerun bench tp for the issue-21 table.
#   2. gq on integ-tk (bwd-gqa's test and bench; merge bwd-gqa if green and native beats repeat).
#   3. trc on main, mcl on moe-claims, ao on attn-ostore, tc on main (as in the 01:20 entry below).
# 2026-12-07 06:20 (twentieth session, 05:38-08:38): five calls ran (H100, then an H200; budget spent by 06:10):
# tk (rs-ticket green at worlds 2-4, slower than unfused: merged off), gq (bwd-gqa merged), trc (overlap ceiling
# 1.05-1.11), mcl (moe-claims merged), ao (attn-ostore not faster: kept), FP8 op on the H200 (lowest 0.826: the H200
# table has no FP8 rows). main now = those merges (native sources 0573529, module .carry/prebuilt-main). Next:
#   1. tk2 on rs-ticket2 (git checkout --detach rs-ticket2; rm -rf .carry/prebuilt; cp -r .carry/prebuilt-rs-ticket2
#      .carry/prebuilt; SOURCES dbdf029): the fixup's batched loads and bar.red broadcast, the claimed end (blocks
#      leave instead of holding SMs that a late cluster needs under MPS); 9 ticket tests, bench at world 2 (with the
#      old end and on a 30-SM grid too), world 4, traces at 2 and 4, and on an H200 the FP8 op with the H100 table's
#      rows. One full call:
#        run(command="export OUT; nvidia-smi -L; TANDEM_COMMIT=<hash> CALL_S=560 timeout 570 bash tools/device_next.sh
#            tk2", carry=[".whl", ".carry/prebuilt"])
#      Green and faster than rs-ticket: merge rs-ticket2 (if the ticket beats unfused anywhere, auto's table next).
#   2. The GPU suite on main after the merges (part n1 = test_tp + test_moe, then n2), module prebuilt-main.
#   3. On an H200: parts f8a and f8b (the FP8 sweep of every configuration, 12 shapes a call: one call of 24 ran
#      past 330 s), then `tandem tune gemm --from-bench` of both into gemm_tune_h200.json's FP8 rows, and the op
#      with that table (bench gemm --no-variants) in a later call.
# 2026-12-07 08:40 (twenty-first session, 07:38-): one H100 from 07:51; tk2 ran (rs-ticket2 green, merged off by
# default: batched fixup loads 1.6 -> 0.95 ms, the claimed end slower for RS), n1 + faults/train + ring attention on
# main 70a6ce0 (test_tp 64, test_moe 30, 7, 22 passed). main's module: .carry/prebuilt-main (SOURCES dbdf029). Next:
#   1. tk3 on branch rs-ticket3 (the owner's sums straight into its output; the end copies only flagged tiles):
#        cd /work/main && git checkout --detach rs-ticket3 && rm -rf .carry/prebuilt &&
#        cp -r .carry/prebuilt-rs-ticket3 .carry/prebuilt   (SOURCES 4ac47c8 == bash tools/native_sources_hash.sh)
#        run(command="export OUT; nvidia-smi -L; TANDEM_COMMIT=<hash> CALL_S=560 timeout 570 bash
#            tools/device_next.sh tk3", carry=[".whl", ".carry/prebuilt"])
#      16 ticket tests (auto's plan "ticket" among them) and the ring's 6, traces at worlds 4 and 2 (ticket vs in 4 and 2 rounds vs
#      through-the-staging vs common order vs the old end), tandem tune -n 4 with the ticket candidates,
#      bench tp --ticket at worlds 4, 2, 3. Green: merge. If the ticket beats unfused at a shape: tandem tune -n 4 and
#      -n 2 into the shipped tp_tune_h100/h200.json (auto's plan "ticket" is built on the branch), then bench tp for
#      issue 21's table.
#   2. On an H200: f8a, f8b, then `tandem tune gemm --from-bench` into gemm_tune_h200.json's FP8 rows (issue 23).
#   3. The rest of the suite on main: test_gemm, test_transport, test_consumer, test_torchrun (not run since 1d71623).
# 2026-12-07 11:45 (twenty-second session, 09:40-12:40): two H100s, four calls, budget spent by 10:06. tk3 ran;
# rs-ticket3 merged into main by fast-forward (b3dd92e, off by default) after test_tp whole (71), test_gemm +
# test_transport + test_torchrun (40) and test_consumer (6) passed there. main's module: .carry/prebuilt-main (SOURCES
# 4ac47c8). The GPU suite is green at b3dd92e except test_moe, test_ring_attention, test_faults, test_tp_train (last
# green at 70a6ce0; b3dd92e changed GEMM+RS host code and tests only). Built since, none of it run. Next, one call
# each, in this order (check out the branch detached, its module into .carry/prebuilt, SOURCES checked):
#   1. pr1 on branch tp-rounds (issue 21: the pipelined GEMM+RS/AR in rounds; .carry/prebuilt-tp-rounds, SOURCES
#      1cf97ea): its tests, then bench tp at worlds 4 and 2 with it. If it beats unfused: merge, make it a tune
#      candidate (mode name of its own: tune refuses it as "pipelined"), rerun bench tp for issue 21's table.
#   2. tk4 on main (.carry/prebuilt-main): the ticket kernel traced on the 28-SM grid (RS, AR), AR with every block
#      waiting, the ring pipelined mode with 1 / 4 pieces and the copy kernel, the core against cuBLAS (20 reps).
#   3. mc1, mc3, then mc2 on branch moe-dedup (.carry/prebuilt-moe-dedup, SOURCES c0f99e6; it holds moe-gemm-c1:
#      the 1x1 grouped GEMM and GEMM 2 by tandem, plus the dispatch's token once per rank): the tests, then the
#      timings (moe_layer_steps, bench moe --layer). Merge what passes (moe-gemm-c1 alone if only mc1 passes:
#      .carry/prebuilt-moe-gemm-c1, SOURCES a719ad1); a knob becomes a default only where mc2 shows it faster.
#   4. test_moe, test_ring_attention, test_faults, test_tp_train on main after the merges (device_suite.sh), and
#      test_tp whole on branch rs-step-params (a host-side dedup of the GEMM+RS launch setup, no kernel change;
#      .carry/prebuilt-rs-step-params, SOURCES a37c421): merge it when test_tp passes.
#   5. an1 on main (issue 25: ncu of tandem's attention forward beside cuDNN's at the two shapes furthest behind).
#   6. On an H200 (a plain run may get one; never ask needs_h200 for it): f8a, f8b, then `python -m tandem tune gemm
#      --from-bench <f8a>/gemm_w1.json <f8b>/gemm_w1.json --out python/tandem/ops/gemm_tune_h200.json`, then the
#      FP8 op check (issue 23).
# 2026-12-07 13:10 (twenty-third session, 12:23-): one H100, seven calls (budget spent by 12:52 and by refused
# starts after): pr1 (tp-rounds correct, not faster: not merged), tk4, the suite remainder on main (59 passed), mc1 /
# mc3 (moe-dedup merged, knobs off), mc2 (MoE timings), an1. Next, in this order (restore branches from
# tools/pending/*.diff if gone; a new checkout has no .whl / .carry: step 0 of the 2026-12-06 12:20 entry):
#   0. ac1 on branch rs-accumulate (issue 21: GEMM+RS/AR by TMA reduce-add into the owners, no waits between chunks;
#      docs/fused-kernels.md): its tests, bench tp w4/w2 with both chunk orders. If it beats unfused: merge, then a
#      tune candidate under a mode name of its own, and bench tp for issue 21's table.
#   1. oc1 on branch moe-plan: the overlap ceiling (tools/diag/tp_overlap_ceiling.py, issue 21: is 1.15 x max(cuBLAS,
#      collective) reachable by any overlap under MPS here?) and the MoE plan's tests + bench; merge moe-plan if green
#      and the layer is not slower than the old defaults at the 256-row shapes.
#   2. gx on branch gemm-c2x2 (2x2 / 4x2 cluster GEMM variants: tests, gemm_mps at worlds 4 and 2). If a bigger
#      cluster closes the core's 1.20-1.37x gap to cuBLAS under MPS, it is the next fused-kernel GEMM role (issue 21)
#      and a table candidate (issue 23).
#   3. test_tp whole on branch rs-step-params (host refactor of gemm_rs_sm90.cu), then merge.
#   4. On an H200: f8a, f8b and the FP8 rows of gemm_tune_h200.json (issue 23).
# 2026-12-07 13:40: before 1., part ac1 on branch rs-accumulate (issue 21: GEMM+RS/AR by TMA reduce-add into the
#   owners' fp32 accumulators, no waits between chunks; tools/pending/rs-accumulate.diff; the part is on the branch).
# 2026-12-07 14:00: branch integ-next = main + rs-accumulate + gemm-c2x2 + moe-plan (tools/pending/integ-next.diff;
#   none of it run): ONE module build serves parts ac1, gx and oc1 (prebuild it once, ~20 min on 2 cores), one call
#   each; merge the parts' branches whose tests pass (their diffs are in tools/pending too).
# 2026-12-07 16:45 (twenty-fourth session, 15:11-): four H200 starts failed, then two H100s: ac2 (x2), ox, ac3 and
# two short calls on branch integ-next. moe-plan merged; rs-accumulate (fixed: 32 adds a tile) correct and slower
# than unfused, not merged; gemm-c2x2 no faster, not merged; the overlap ceiling measured at 32 rows (issue 21:
# the 1.15 target is beyond any arrangement of cuBLAS + tandem's collective at GEMM+AR and at world 4 GEMM+RS).
# Next, in this order:
#   1. On an H200: f8ab (f8a + f8b in one call), then `python -m tandem tune gemm --from-bench` into
#      gemm_tune_h200.json's FP8 rows and the FP8 op at the 24 shapes (issue 23).
#   2. test_tp whole (part t1; split it by -k if one call cannot hold it) on branch rs-step-params2 (= main 8a85729
#      + the host refactor of gemm_rs_sm90.cu; tools/pending/rs-step-params.diff), module .carry/prebuilt-rsp
#      (SOURCES 86f675a, built 2026-12-07), then merge.
#   3. Issue 21 where the ceiling is within 1.15 (world 2 AG+GEMM at 16384x8192x4096 and the Llama shapes, GEMM+RS
#      at 8192x28672x8192): bench tp shows pipelined 1.24x the bar and auto on unfused there (why: not examined);
#      `tandem tune tp` at those shapes.
#   4. Issue 25: part ai on branch attn-items (tools/pending/attn-items.diff), modules built 2026-12-07:
#        git checkout attn-items && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-attn-items .carry/prebuilt
#        run(command="export OUT; TANDEM_COMMIT=a4ac87c CALL_S=570 timeout 580 bash tools/device_next.sh ai",
#            carry=[".whl", ".carry/prebuilt", ".carry/before"])      (.carry/before = main 2bdf627's python + module)
#      Merge if the tests pass and the forward is not slower. Issue 26: the fused whole layer (not built).
#   (.carry/prebuilt and .carry/prebuilt-main = main's module, SOURCES 8ecfdb6, for f8ab and anything on main.)
# 2026-12-07 19:00 (twenty-fifth session, 17:59-): two H200 starts refused, then an H100 (parts ai, ps) and an
# H200 (f8ab, h23, br); attn-items merged (no measurable change), the H200 table's FP8 rows (FP8 row-wise target
# met on the H200), bench tp's columns interleaved (--rounds), the H200 TP table's Llama rows. Next, in this order:
#   1. On an H200: part g23 (the bf16 sweep, the tune on the device, the ops again, in one call; the H200 bf16
#      rows are older than half the configurations; commit the gemm_tune_h200.json it returns) (issue 23: bf16
#      lowest 0.805, FP8 tensor-wise lowest 0.823 at 777x4112x4096, a single call's host path: 0.924 back to back).
#      Any card meanwhile: part dx (= mfc + abk: issue 26's fusion ceiling, issue 25's backward kernels).
#   2. Issue 21: parts tpr4 and tpr2 (bench tp whole with --rounds 3; on the H200 for its table, whose other rows
#      are from 08d31dd), then `tandem tune --from-bench` over them, and docs/results/tp_w4/tp_w2 from them.
#   3. Read dx's two results (they are parts mfc and abk): issue 26, if layer / gemms is below 1.3 at 4k-16k
#      tokens, no fusion meets the target here: say so, as issue 21's ceiling did; else build the fused whole
#      layer (docs/moe.md's design). Issue 25: abk names the kernels around the world-1 backward's cuDNN call
#      (it trails SDPA's cuDNN backward at 0.75-0.8 though it calls cuDNN's own backward); then the causal
#      forward's per-item instructions and tiles (FA3's hopper/tile_size.h, bf16: d64 192x192 non-causal and
#      192x128 causal, three consumer warpgroups; d128 128x176 non-causal; tandem 128x128 everywhere).
#   A fresh checkout: bash tools/fetch_device_wheels.sh; pip install cmake nvidia-cutlass==4.2.0.0 pybind11 ninja;
#   python3.12 -m pip install torch==2.13.0 pytest pytest-timeout numpy matplotlib; then the module (next line)
#   in a detached worktree (git worktree add --detach /tmp/wt <commit>): about 10 min on 2 cores.
#   (.carry/prebuilt = main's module, SOURCES 2016aa8; rebuild it in a fresh checkout: tools/prebuild_device_module.sh.
#    Two modules and the tree exceed the call's 64 MiB carry: pack the second, tar czf .carry/before.tgz -C .carry before.)
# 2026-12-07 20:45 (twenty-sixth session, 20:02-): no device call ran -- four starts refused (H200 and H100, about
# 480 s of the budget), then "no new device machine is lent at present" for the session. New, not run: branch
# attn-key-tile (tools/pending/attn-key-tile.diff): the forward's K/V tile as a plan field (176 rows, FA3's for
# non-causal d 128, opt-in), the mask test once per work item, and the consumers' K / V stage as a compile-time
# index at d 128 -- the d 128 / 128 kernel has no local memory left (main: 47 local loads, 29 stores, 120 B spills).
# Next session, in this order (the order above stands for g23, dx, tpr4/tpr2):
#   0. Restore the branch if gone (git checkout -b attn-key-tile main && git apply tools/pending/attn-key-tile.diff;
#      the diff applies to main c331a14), build its module (tools/prebuild_device_module.sh in a worktree of it:
#      SOURCES 6d4b8c4 at b7f1bd1), carry it.
#      Its module serves every part below (GEMM, TP and MoE sources are main's), so one carry does the session:
#        H200: g23, then kt, then dx;  H100: kt, then dx, then tpr2.
#      Then part rif on branch rs-inflight (tools/pending/rs-inflight.diff, SOURCES 49a56ad; its own module, with
#      main's as .carry/before): the GEMM+RS reduction role with 64 bytes in flight instead of 128 (no spills of
#      the loaded vectors), its tests and bench tp before/after; merge if the tests pass and RS/AR are not slower.
#      kt = the attention tests (both tiles forced, worlds 1-3) + attn_fwd_table.py with tiles 128 and 176 as
#      interleaved columns, main's kernel before each (.carry/before: main's python/ + module, packed:
#        rm -rf .carry/before && mkdir -p .carry/before && git archive main python | tar -x -C .carry/before &&
#        cp <main's .carry/prebuilt>/_C*.so .carry/before/python/tandem/ && git rev-parse --short main > .carry/before/COMMIT &&
#        tar czf .carry/before.tgz -C .carry before     # carry [".whl", ".carry/prebuilt", ".carry/before.tgz"]).
#      Merge if the tests pass and the branch is not slower at tile 128 (first_masked_tile: the causal rows); make 176
#      the default only where it wins (non-causal d128), else set key_tile_of's heuristic to 128.
# 2026-12-08 00:00 (twenty-seventh session, 22:36-): one H100 from 23:03 after four refused or cooled-down starts;
# parts kt, dx, rif ran (docs/results.md, section of 23:03-23:20). rs-inflight2 merged (a2be1de: SASS of every
# kernel identical to one of the two measured builds). Branches for the next session, each with its module in
# .carry (SOURCES in brackets; a fresh checkout: restore from tools/pending/<branch>.diff, rebuild with
# tools/prebuild_device_module.sh in a worktree) and .carry/before.tgz = main's python/ + module (main 480ce49):
#   attn-key-tile (42761f8, [a6d7fb4] .carry/prebuilt-kt): the 128-row kernels back to run-time K/V stage indices (the
#     compile-time ones ran the d128/128 kernel 25-35 % slower), the 176-row kernel as measured (SASS identical),
#     key tile 176 by default at d128 where an item sees >= 2048 keys. Part kt; merge if the tests pass and the
#     default column (tile 0) is not slower than main at any row beyond the runs' spread.
#   moe-stage-combine (aba966f, [2f72dec] .carry/prebuilt-msc): the MoE stage copy and the combine's sums with 8
#     loads in flight. Part msc; merge if test_moe passes and dispatch / combine are faster.
#   attn-bwd-host (b27c01f, Python only: main's module [3375e19] .carry/prebuilt-main): the world-1 backward's host path
#     trimmed, bench attention's back-to-back columns. Part abh (its gradient tests, then the host profile: where SDPA's 380-500 us and tandem's 750-870
#     us go); merge if the tests pass.
# Call form (the working tree must be the branch; .carry/prebuilt its module):
#   git checkout <branch> && rm -rf .carry/prebuilt && cp -r .carry/prebuilt-<x> .carry/prebuilt
#   run(command="export OUT; TANDEM_COMMIT=<hash> CALL_S=570 timeout 580 bash tools/device_next.sh <part>",
#       carry=[".whl", ".carry/prebuilt", ".carry/before.tgz"])
# Order: on an H200, g23 first (main), then kt, msc, abh, tpr4 / tpr2 (main); on an H100: kt, msc, abh, tpr2.
# (Earlier parts are in git history: git log -p tools/device_next.sh. Parts ac1-ac3 (branch rs-accumulate) and gx
# (branch gemm-c2x2) were removed 2026-12-07 19:10: their branches are not on main and are kept only as
# tools/pending/*.diff records, which carry ac1 and gx; ac2 and ac3 are in git history.)
set -uo pipefail
# a prebuilt module (tools/prebuild_device_module.sh) is imported from python/ (device_suite.sh copies it there);
# with an editable install, its finder takes precedence over this path
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-$PWD/_out}
export OUT TANDEM_BENCH=0
part=${1:-n1}
# One branch a part: the chain below runs the first that matches, so a name used twice would silently run an older
# part (2026-12-06: "c1" ran 2026-12-05's claims trace instead of the new part of that name).
defined=$(grep -cE "^(el)?if .*\[ \"\\\$part\" = ${part} \]" "$0")
[ "$defined" -eq 1 ] || { echo "device_next.sh: part '$part' is defined $defined times (must be once)"; exit 2; }
start=$(date +%s)
# Packed carries (the call's carry is at most 64 MiB, and two modules with the tree pass it): .carry/<name>.tgz
# holds .carry/<name>/ (tar czf .carry/before.tgz -C .carry before); unpacked here once
for f in .carry/*.tgz; do
  [ -f "$f" ] && [ ! -e "${f%.tgz}" ] && tar xzf "$f" -C .carry && echo "unpacked $f"
done
CALL_S=${CALL_S:-575}
left() { echo $(( CALL_S - ($(date +%s) - start) )); }
# bench tp for one variant of a part: into $W/$part/bench_w<world>_<label>, $OUT/$part.tgz after it, the gemm_rs /
# gemm_ar progress rows printed (a timeout still shows them); at most CAP s and the call's time left less 10.
#   tp_bench FLAGS WORLD SHAPES LABEL CAP [VAR=value ...]     (FLAGS: e.g. --ticket, or "" for none)
tp_bench() {
  local flags=$1 w=$2 shapes=$3 label=$4 cap=$5; shift 5
  local t=$(( $(left) - 10 )); [ "$t" -gt "$cap" ] && t=$cap
  [ "$t" -gt 20 ] && env "$@" timeout -s INT -k 5 $t python3 -m tandem bench tp -n $w --reps 5 $flags \
    --shapes $shapes --out "$W/$part/bench_w${w}_$label" 2>&1 | grep -E "gemm_(rs|ar)|Error" | grep -v "^|" | \
    sed "s/^/w$w $label: /" | cut -c1-300
  rm -f "$W/$part"/*/*.png; tar czf "$OUT/$part.tgz" -C "$W" "$part"
}
# bench gemm's 24 shapes (issue 23) in two halves of 12, for sweeps one call cannot hold whole: HALF a or b; FP8
# "fp8" names N rounded up to 16 (what bench gemm times for FP8 in any case).
#   gemm_half_shapes a|b [fp8]
gemm_half_shapes() {
  local n1000=1000 n3000=3000 n4104=4104 n5000=5000
  [ "${2:-}" = fp8 ] && { n1000=1008; n3000=3008; n4104=4112; n5000=5008; }
  if [ "$1" = a ]; then
    echo "256x4096x14336,256x14336x4096,256x8192x28672,256x28672x8192,1024x4096x14336,1024x14336x4096,\
1024x8192x28672,1024x28672x8192,16384x4096x14336,16384x14336x4096,3000x${n5000}x4000,1000x${n1000}x1008"
  else
    echo "4096x4096x14336,4096x14336x4096,4096x8192x28672,4096x28672x8192,16384x8192x28672,16384x28672x8192,\
777x${n4104}x4096,5000x${n3000}x8208,100x8192x8192,12345x4096x4096,4096x${n1000}x2064,2500x14336x4096"
  fi
}
# Every configuration and schedule of DTYPES (bench gemm) at both halves, into $W/$part/<PREFIX>a and <PREFIX>b,
# until END (epoch seconds; the first half gets half of what is left), $OUT/$part.tgz after each half (a cut half
# keeps its partial rows).
#   gemm_sweep_halves DTYPES REPS END PREFIX [fp8] [bench gemm args...]
gemm_sweep_halves() {
  local dtypes=$1 reps=$2 end=$3 prefix=$4 kind=${5:-}; shift 5
  local half t
  for half in a b; do
    t=$(( end - $(date +%s) )); [ $half = a ] && t=$(( t / 2 ))
    [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --dtypes $dtypes --reps $reps "$@" \
      --shapes "$(gemm_half_shapes $half $kind)" --out "$W/$part/$prefix$half" 2>&1 | grep -E "geometric|best|Error"
    rm -f "$W/$part"/*/*.png; tar czf "$OUT/$part.tgz" -C "$W" "$part"
  done
}
# tools/diag/attn_bwd_kernels.py (issue 25: the kernels of the world-1 backward beside SDPA's cuDNN backward) into
# FILE (JSON lines), each row printed cut to WIDTH; at most CAP s.
#   attn_bwd_kernels FILE CAP WIDTH
attn_bwd_kernels() {
  local t=$(( $(left) - 10 )); [ "$t" -gt "$2" ] && t=$2
  timeout -s INT -k 10 $t python3 -m tandem.launch -n 1 -- python3 tools/diag/attn_bwd_kernels.py \
    --out "$1" 2>&1 | python3 -c "
import json, sys
for line in sys.stdin:
    try: r = json.loads(line)
    except ValueError: print(line.rstrip()[:200]); continue
    print(r['shape'], r['path'], r['total_us'], '|', '; '.join(f\"{k['name'][:70]} {k['us']}\" for k in r['kernels'])[:$3])"
}
# tools/diag/moe_fusion_ceiling.py (issue 26) at worlds 2, 1 and 4 into $W/$part/<PREFIX>w<world>, worlds 2 and 1
# at most CAP s each, world 4 what is left; $OUT/$part.tgz after each.
#   moe_fusion_ceiling PREFIX CAP
moe_fusion_ceiling() {
  local w t
  for w in 2 1 4; do
    t=$(( $(left) - 10 )); [ $w != 4 ] && [ "$t" -gt "$2" ] && t=$2
    [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n $w -- python3 tools/diag/moe_fusion_ceiling.py \
      --tokens 1024,4096,16384 --out "$W/$part/$1w$w" 2>&1 | grep -E "tokens w|Error|error" | cut -c1-300
    tar czf "$OUT/$part.tgz" -C "$W" "$part"
  done
}
# tools/diag/tp_trace.py of GEMM+RS at 16384x8192x4096 (the fused grid at the rank's share, 2 reps) with VARIANTS,
# into $W/$part/trace_w<world>, its last LINES lines printed; at most CAP s.
#   tp_trace_rs WORLD CAP VARIANTS LINES
tp_trace_rs() {
  local t=$(( $(left) - 5 )); [ "$t" -gt "$2" ] && t=$2
  [ "$t" -gt 20 ] && timeout -s INT -k 5 $t python3 -m tandem.launch -n $1 -- python3 tools/diag/tp_trace.py \
    --shapes 16384x8192x4096 --ops gemm_rs --comm-blocks 0 --reps 2 --variants "$3" \
    --out "$W/$part/trace_w$1" 2>&1 | tail -$4 | cut -c1-250
  tar czf "$OUT/$part.tgz" -C "$W" "$part"
}
# The tree of one side of a before/after comparison: sets pp (its python/ for PYTHONPATH) and c (its commit) for
# SIDE before (${BEFORE_DIR:-.carry/before}: python/ and module, COMMIT inside) or after (this tree); returns 1
# when the before side was not carried.
#   side_tree before|after || continue
side_tree() {
  local bd=${BEFORE_DIR:-.carry/before}
  pp=$PWD/python; c=${TANDEM_COMMIT:-unknown}
  if [ "$1" = before ]; then
    [ -d "$bd/python" ] || return 1
    pp=$PWD/$bd/python; c=$(cat "$bd/COMMIT")
  fi
}
# One side of issue 22's before/after comparison: `tandem bench ARGS` with the side's tree and commit (before:
# af75616's python/ and module in .carry/before; after: this tree), output in DIR/SIDE, at most CAP s and the
# call's time left less 20 (skipped under 30); its plots dropped (at most 8 files come back).
#   bench_side before|after CAP DIR ARGS...
bench_side() {
  local s=$1 cap=$2 dir=$3; shift 3
  local pp=$PWD/python c=${TANDEM_COMMIT:-unknown}
  local bd=${BEFORE_DIR:-.carry/before}
  [ "$s" = before ] && { pp=$PWD/$bd/python; c=$(cat $bd/COMMIT); }
  local t=$(( $(left) - 20 )); [ "$t" -gt "$cap" ] && t=$cap
  [ "$t" -lt 30 ] && { echo "bench $* ($s) skipped: $(left) s left"; return; }
  mkdir -p "$dir/$s"
  PYTHONPATH=$pp TANDEM_COMMIT=$c timeout -s INT -k 10 $t python3 -m tandem bench "$@" --out "$dir/$s" 2>&1 | tail -4
  rm -f "$dir/$s"/*.png
}
# bench tp at worlds 4 and 2 into $OUT/diag, each bounded by `cap` s and by the call's time left less `margin`;
# the archive is refreshed after each (bench tp writes its rows after every case: a timeout keeps them)
bench_tp_worlds() {
  local cap=$1 margin=$2 n t
  for n in 4 2; do
    t=$(( $(left) - margin )); [ "$t" -gt "$cap" ] && t=$cap
    [ "$t" -lt 60 ] && { echo "bench tp -n $n skipped: $t s left"; continue; }
    timeout -s INT -k 10 $t python3 -m tandem bench tp -n $n --reps 5 --out "$OUT/diag" 2>&1 | tail -24
    tar czf "$OUT/diag.tgz" -C "$OUT" diag
  done
}
# The 128x208 swapped tile's measurements (parts s208 and nx): bench gemm bf16 with every configuration at the
# shapes furthest below cuBLAS (capped at 120 s and the call's time left less `margin`), then Nsight Compute at
# 777 x 4104 x 4096 against cuBLAS; in /tmp/NAME/NAME, archived as $OUT/NAME.tgz after each step.
#   worst_shapes_and_ncu NAME MARGIN
worst_shapes_and_ncu() {
  local name=$1 margin=$2 W=/tmp/$1 t
  local S=777x4104x4096,3000x5000x4000,100x8192x8192,4096x1000x2064,5000x3000x8208,12345x4096x4096,1024x8192x28672
  rm -rf "$W"; mkdir -p "$W/$name" "$OUT"
  t=$(( $(left) - margin )); [ "$t" -gt 120 ] && t=120
  [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 --dtypes bfloat16 \
    --shapes $S --out "$W/$name/bf16" 2>&1 | grep -E "geometric|best|Error"
  rm -f "$W/$name"/*/*.png; tar czf "$OUT/$name.tgz" -C "$W" "$name"
  t=$(( $(left) - 5 )); [ "$t" -gt 60 ] && t=60
  [ "$t" -gt 20 ] && timeout -s INT -k 5 $t ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    -k regex:"device_kernel|nvjet" python3 tools/diag/gemm_ncu.py --shape 777x4104x4096 --calls 1 \
    --variants coop_128x256_c1,swap_coop_208x128_c2 > "$W/$name/ncu_777.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|rel\. diff|MMA_64x" "$W/$name/ncu_777.txt" | cut -c1-160 | head -20
  tar czf "$OUT/$name.tgz" -C "$W" "$name"
}
if [ "$part" = n1 ]; then
  timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_tp.py tests/gpu/test_moe.py
elif [ "$part" = e5 ]; then
  # branch tp-train (not run before): the TP ops' autograd and tandem.nn (tests/gpu/test_tp_train.py), and the
  # TP tests around the two new ops (all_gather_rows, ag_gemm_gathered use the AG kernel's gather launch)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-200} )) bash tools/device_suite.sh tests/gpu/test_tp_train.py \
    tests/gpu/test_tp.py -k "train or test_ag_gemm_and_gemm_rs_match_torch or gathered_view"
  mkdir -p "$OUT/diag"
  for n in 4 2; do
    t=$(( $(left) / 2 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench train -n $n --reps 3 \
      --out "$OUT/diag" 2>&1 | tail -6
    tar czf "$OUT/diag.tgz" -C "$OUT" diag
  done
elif [ "$part" = n2 ]; then
  timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_ring_attention.py \
    tests/gpu/test_gemm.py tests/gpu/test_faults.py tests/gpu/test_transport.py tests/gpu/test_consumer.py \
    tests/gpu/test_torchrun.py
elif [ "$part" = n3 ]; then
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  timeout -s INT -k 10 60 python3 -m tandem.launch -n 3 -- python3 tools/diag/cublas_mps_check.py \
    --out "$OUT/diag/cublas_w3" 2>&1 | grep -v "^|---" | tail -14
  bench_tp_worlds 150 200
  t=$(( $(left) - 130 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n 4 --reps 3 --sweep \
    --shapes 16384x8192x4096 --out "$OUT/diag/sweep" 2>&1 | tail -6
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 65 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --out "$OUT/diag" 2>&1 | tail -8
  t=$(( $(left) - 5 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench attention -n 2 --out "$OUT/diag" 2>&1 | tail -8
  tar czf "$OUT/diag.tgz" -C "$OUT" diag && rm -rf "$OUT/diag"
elif [ "$part" = f ]; then
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  for n in 4 2; do
    timeout -s INT -k 10 150 python3 -m tandem.launch -n $n -- python3 tools/diag/tp_overhead.py \
      --out "$OUT/diag/overhead_w$n" 2>&1 | grep -v "^|---" | tail -40
    tar czf "$OUT/diag.tgz" -C "$OUT" diag
  done
elif [ "$part" = t1 ]; then
  timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_tp.py
elif [ "$part" = g ]; then
  timeout -s INT -k 20 $(( $(left) - 200 )) bash tools/device_suite.sh tests/gpu/test_gemm.py
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --out "$OUT/diag" 2>&1 | tail -40
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = m ]; then
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  timeout -s INT -k 10 200 python3 -m tandem.launch -n 2 -- python3 tools/diag/moe_fused.py --hidden 7168 \
    --inter 2048 --experts 256 --k 8 --tokens 1024 --quick 2>&1 | tail -40
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 \
    --out "$OUT/diag" 2>&1 | tail -12
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = t ]; then
  # fused TP kernels' timelines and variants (tools/diag/tp_trace.py): worlds 4 and 2
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  # 2026-12-04 21:00 (world 4): one rank's 7 clusters started 1-7.5 ms late in every launch. Does a grid of 28
  # or 24 SMs a rank (of 32) make every rank's clusters resident? And world 2 (66 SMs a rank).
  V="base;TANDEM_RS_PIECES=4"
  for n in 4 2; do
    t=$(( $(left) - 20 )); [ "$t" -gt 250 ] && t=250
    [ "$t" -lt 40 ] && continue
    sms=$([ $n = 4 ] && echo 0,28,24 || echo 0,60,56)
    timeout -s INT -k 10 $t python3 -m tandem.launch -n $n -- python3 tools/diag/tp_trace.py \
      --shapes 16384x8192x4096,8192x4096x8192 --ops gemm_rs,gemm_ar,ag_gemm --comm-blocks 6,2 --sm-counts $sms \
      --variants "$V" --out "$OUT/diag/trace_w$n" 2>&1 | tail -150
    tar czf "$OUT/diag.tgz" -C "$OUT" diag
  done
elif [ "$part" = t4 ]; then
  # 2026-12-05 (session start; the claim/join branches were lost with the old checkout): does a fused grid smaller
  # than the rank's share (28/24/20 of 32 SMs) or 1 reduce block fewer make every rank's clusters resident at world 4?
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 60 )); [ "$t" -gt 300 ] && t=300
  timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- python3 tools/diag/tp_trace.py \
    --shapes 16384x8192x4096 --ops gemm_rs,ag_gemm --comm-blocks 6 --sm-counts 0,28,24,20 \
    --variants "base;TANDEM_RS_PIECES=4" --out "$OUT/diag/trace_w4" 2>&1 | tail -80
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 10 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t bash tools/device_suite.sh tests/gpu/test_tp.py \
    -k "test_ag_gemm_and_gemm_rs_match_torch or 1000_launches or emulated" 2>&1 | tail -15
elif [ "$part" = c1 ]; then
  # 2026-12-05: tile claims (TANDEM_TP_CLAIM=1, off by default), the joined reduction (TANDEM_RS_JOIN=1) and the
  # AG+GEMM release fix: their tests and the core test_tp cases, then the world-4 trace of claims against the
  # static stride (whole chunks, pieces, pieces joined)
  timeout -s INT -k 20 $(( $(left) - 240 )) bash tools/device_suite.sh tests/gpu/test_tp.py \
    -k "tile_claims or gathered_view or test_ag_gemm_and_gemm_rs_match_torch or in_pieces or 1000_launches"
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- python3 \
    tools/diag/tp_trace.py --shapes 16384x8192x4096 --ops gemm_rs,ag_gemm --comm-blocks 6 \
    --variants "base;TANDEM_TP_CLAIM=1;TANDEM_RS_PIECES=4;TANDEM_TP_CLAIM=1,TANDEM_RS_PIECES=4;TANDEM_TP_CLAIM=1,TANDEM_RS_PIECES=4,TANDEM_RS_JOIN=1" \
    --out "$OUT/diag/trace_w4" 2>&1 | tail -60
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = c2 ]; then
  # the whole of test_tp with tile claims on (the default since 2026-12-05), then bench tp at world 4 with the
  # fused RS/AR in pieces (TANDEM_RS_PIECES=auto: the candidate default)
  timeout -s INT -k 20 $(( $(left) - 200 )) bash tools/device_suite.sh tests/gpu/test_tp.py
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 10 )); [ "$t" -gt 60 ] && TANDEM_RS_PIECES=auto timeout -s INT -k 10 $t python3 -m tandem bench \
    tp -n 4 --reps 5 --out "$OUT/diag" 2>&1 | tail -24
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = c3 ]; then
  # c2 without the bench (little device time left): the whole of test_tp with claims and pieces on by default
  timeout -s INT -k 20 $(( $(left) - 5 )) bash tools/device_suite.sh tests/gpu/test_tp.py
elif [ "$part" = c4 ]; then
  # the test_tp cases most at risk with claims and pieces on by default (cross-node paths, back-to-back launches
  # and graphs, the late-rank claims test that failed on its own count at 3447567)
  timeout -s INT -k 20 $(( $(left) - 5 )) bash tools/device_suite.sh tests/gpu/test_tp.py \
    -k "emulated or 1000_launches or late or test_ag_gemm_and_gemm_rs_match_torch"
elif [ "$part" = d1 ]; then
  # 2026-12-05 (second session): the whole of test_tp with claims and pieces on by default and the claims now
  # across emulated nodes too, then bench tp at world 4 and 2 with what is left
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-0} - 5 )) bash tools/device_suite.sh tests/gpu/test_tp.py
  mkdir -p "$OUT/diag"
  bench_tp_worlds 240 10
elif [ "$part" = d0 ]; then
  # the test_tp cases not run since claims and pieces became the default (and claims across the emulated nodes),
  # plus the broad correctness cases for the reread 372866e; then the world-4 trace of the fused grid on fewer SMs
  # than the rank's share (does a smaller grid make every rank's 2-CTA clusters resident under MPS?)
  timeout -s INT -k 20 $(( $(left) - ${TRACE_S:-200} )) bash tools/device_suite.sh tests/gpu/test_tp.py -k \
    "emulated or disagree or out_of_step or pipelined or bad_input or with_tile_claims_match or test_ag_gemm_and_gemm_rs_match_torch"
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- python3 \
    tools/diag/tp_trace.py --shapes 16384x8192x4096 --ops gemm_rs,ag_gemm --comm-blocks 6,2 --sm-counts 0,30,28,24 \
    --reps 3 --out "$OUT/diag/trace_w4" 2>&1 | grep -v "^ *raw" | tail -60
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = d3 ]; then
  # the fused grid and piece count under MPS: at world 4 a grid of 28 of 32 SMs had every rank's clusters resident
  # (GEMM+RS 5.0 -> 4.2 ms; AG+GEMM slower); which grid and pieces, at worlds 4 and 2, at two shapes
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  V="base;TANDEM_RS_PIECES=4;TANDEM_RS_PIECES=2"
  timeout -s INT -k 10 $(( $(left) / 2 )) python3 -m tandem.launch -n 4 -- python3 tools/diag/tp_trace.py \
    --shapes 16384x8192x4096,8192x8192x28672 --ops gemm_rs,gemm_ar --comm-blocks 4,6,8 --sm-counts 0,30,28 \
    --variants "$V" --reps 3 --out "$OUT/diag/grid_w4" > "$OUT/diag/grid_w4.log" 2>&1; tail -3 "$OUT/diag/grid_w4.log"
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 2 -- python3 \
    tools/diag/tp_trace.py --shapes 16384x8192x4096,8192x8192x28672 --ops gemm_rs,gemm_ar,ag_gemm --comm-blocks 4,6,8 \
    --sm-counts 0,62,60,56 --variants "$V" --reps 3 --out "$OUT/diag/grid_w2" > "$OUT/diag/grid_w2.log" 2>&1
  tail -3 "$OUT/diag/grid_w2.log"
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = d4 ]; then
  # the fused GEMM+RS/AR grid at 7/8 of the share on a GPU shared by 4+ ranks (tp_plan.fused_grid_sms): the
  # world-4 correctness cases that run it, what the ranks see, then bench tp at world 4
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-150} )) bash tools/device_suite.sh tests/gpu/test_tp.py -k \
    "test_ag_gemm_and_gemm_rs_match_torch[4] or in_pieces_match_torch[4] or 1000_launches_identical_and_cuda_graph_replay[4] or late_match_torch[4]"
  timeout 60 python3 -m tandem.launch -n 4 -- python3 -c "
import tandem, tandem.ops.tp as tp
c = tandem.Communicator()
print('rank', c.rank, 'share', c.sm_count, 'ranks_on_device', c.ranks_on_device, 'fused grid rs/ar/ag',
      tp.fused_sms(c, 'gemm_rs', 0), tp.fused_sms(c, 'gemm_ar', 0), tp.fused_sms(c, 'ag_gemm', 0))
c.destroy()" 2>&1 | grep rank | head -4
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 10 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n 4 --reps 5 \
    --out "$OUT/diag" 2>&1 | tail -24
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = d5 ]; then
  # with every cluster resident (28 SMs at world 4), is the fused GEMM role slowed by the pieces' calls or by the
  # claims? (the GEMM role ran 1.5-1.8x slower inside the fused kernel than alone on the same SMs)
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 5 )); [ "$t" -gt 20 ] && timeout -s INT -k 5 $t python3 -m tandem.launch -n 4 -- python3 \
    tools/diag/tp_trace.py --shapes 16384x8192x4096 --ops gemm_rs,ag_gemm --comm-blocks 6 --sm-counts 28 --reps 3 \
    --variants "base;TANDEM_RS_PIECES=0;TANDEM_TP_CLAIM=0;TANDEM_TP_CLAIM=0,TANDEM_RS_PIECES=0" \
    --out "$OUT/diag/noise_w4" 2>&1 | grep -v "^ *raw" | tail -40
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = e1 ]; then
  # 2026-12-05 (third session): branch sched-by-ref (the arrival scheduler points at its schedule instead of copying
  # it; ptxas: the fused AG+GEMM stack frame and spills gone, GEMM+RS's cut): the whole of test_tp, then d5's trace
  # (the fused GEMM role against the core alone on the same 28 SMs at world 4)
  timeout -s INT -k 20 $(( $(left) - ${TRACE_S:-120} )) bash tools/device_suite.sh tests/gpu/test_tp.py
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 5 )); [ "$t" -gt 20 ] && timeout -s INT -k 5 $t python3 -m tandem.launch -n 4 -- python3 \
    tools/diag/tp_trace.py --shapes 16384x8192x4096 --ops gemm_rs,ag_gemm --comm-blocks 6 --sm-counts 28 --reps 3 \
    --variants "base;TANDEM_TP_CLAIM=0,TANDEM_RS_PIECES=0" --controls \
    --out "$OUT/diag/noise_w4" 2>&1 | grep -v "^ *raw" | tail -40
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = e2 ]; then
  # 2026-12-05 (third session), after sched-by-ref (GEMM+RS 16384x8192x4096 w4: 4.28 -> 3.86 ms on H100; the GEMM
  # role still 1.5x the core in pieces, 1.17x in whole chunks: a cost per GEMM call): which piece count and comm
  # blocks, at world 4 on the fused grid (28 SMs); then bench tp at worlds 4 and 2
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  t=$(( $(left) - ${BENCH_S:-280} )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- \
    python3 tools/diag/tp_trace.py --shapes 16384x8192x4096,8192x4096x8192,8192x8192x28672 --ops gemm_rs \
    --comm-blocks 6,4 --sm-counts 28 --reps 3 --variants "base;TANDEM_RS_PIECES=4;TANDEM_RS_PIECES=2" \
    --out "$OUT/diag/pieces_w4" > "$OUT/diag/pieces_w4.log" 2>&1
  grep -E "^(gemm|ag)|GEMM steps done|reduce pieces" "$OUT/diag/pieces_w4.log" | cut -c1-260
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  bench_tp_worlds 150 5
elif [ "$part" = e3 ]; then
  # the rest of the GPU suite after sched-by-ref was merged (test_tp passed whole at b03e126)
  timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_gemm.py tests/gpu/test_moe.py \
    tests/gpu/test_ring_attention.py tests/gpu/test_faults.py tests/gpu/test_transport.py tests/gpu/test_consumer.py \
    tests/gpu/test_torchrun.py
elif [ "$part" = b22 ]; then
  # issue 22's last item: the benchmarks on the H200 after the runtime, bindings and leftovers (main), to compare
  # with af75616's (docs/results.md, 2026-12-04 19:00-19:12, the same commands): bench tp w4 and w2, moe w2,
  # attention w2. The whole GPU suite already passed on the H200 after (d7e5bea, 2026-12-05 20:04-20:21).
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  bench_tp_worlds 170 130
  t=$(( $(left) - 65 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --out "$OUT/diag" 2>&1 | tail -8
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 5 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench attention -n 2 --out "$OUT/diag" 2>&1 | tail -8
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = s1 ]; then
  # branch rs-stream-loads (not run before): the GEMM+RS/AR reductions' loads evict-first in L2, a build option
  # (TANDEM_RS_STREAM_LOADS; off, the kernels are main's). The world-4 trace with the default build, then rebuilt
  # with the option: the pieces tests and the same trace (is the GEMM role beside the reductions faster?)
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  trace() {
    local t=$(( $(left) - $2 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- \
      python3 tools/diag/tp_trace.py --shapes 16384x8192x4096,8192x8192x28672 --ops gemm_rs,gemm_ar --comm-blocks 4 \
      --sm-counts 28 --reps 3 --out "$OUT/diag/stream_$1" > "$OUT/diag/stream_$1.log" 2>&1
    grep -E "^(gemm|ag)|GEMM steps done|reduce pieces" "$OUT/diag/stream_$1.log" | cut -c1-300
    tar czf "$OUT/diag.tgz" -C "$OUT" diag
  }
  trace base 400
  TANDEM_PIP_DEFS="-Ccmake.define.TANDEM_RS_STREAM_LOADS=ON" timeout -s INT -k 20 $(( $(left) - 120 )) \
    bash tools/device_suite.sh tests/gpu/test_tp.py -k "in_pieces_match or tile_claims_match"
  trace on 5
elif [ "$part" = g2 ]; then
  # issue 23: bench gemm FP8 with every configuration (the FP8 table's data: python -m tandem tune gemm --from-bench;
  # the FP8 ratios against torch._scaled_mm), then bf16 without variants (the op with the rebuilt table against
  # cuBLAS; its time with that table was never measured)
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag/fp8" "$OUT/diag/bf16"
  t=$(( $(left) - 150 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --dtypes fp8_tensor,fp8_row --out "$OUT/diag/fp8" 2>&1 | tail -6
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 5 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --dtypes bfloat16 --no-variants --out "$OUT/diag/bf16" 2>&1 | tail -6
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = b22x ]; then
  # issue 22's benchmarks before (af75616: .carry/before, tools/prebuild_before.sh) and after (this tree) on one
  # machine in one call, each bench before then after, so any card gives a same-run comparison: bench tp -n 4 and
  # -n 2, bench moe -n 2, bench attention -n 2 (af75616's commands, docs/results.md 2026-12-04 19:00); then
  # tools/diag/compare_runs.py before after on each. Needs carry [".whl", ".carry/prebuilt", ".carry/before"].
  [ -f .carry/before/python/tandem/_C.cpython-312-x86_64-linux-gnu.so ] || { echo "b22x: no .carry/before"; exit 1; }
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  # an editable install (device_suite.sh's fallback build) has a finder that wins over PYTHONPATH: the "before"
  # side would silently be this tree
  got=$(PYTHONPATH=$PWD/.carry/before/python python3 -c "import tandem; print(tandem.__file__)" 2>&1)
  case $got in *.carry/before/*) ;; *) echo "b22x: the before side imports $got"; exit 1 ;; esac
  # outputs outside $OUT (at most 8 files come back): only b22.tgz there
  W=/tmp/b22x; rm -rf "$W"; mkdir -p "$OUT"
  side() {  # side before|after, then the bench's arguments
    bench_side "$1" 150 "$W/b22" "${@:2}"
    tar czf "$OUT/b22.tgz" -C "$W" b22
  }
  # moe and attention write their JSON only at the end (a timeout loses the run); tp after every case: tp last
  for args in "moe -n 2" "attention -n 2" "tp -n 4 --reps 5" "tp -n 2 --reps 5"; do
    side before $args
    side after $args
  done
  for f in tp_w4 tp_w2 moe_w2 attention_w2; do
    [ -f "$W/b22/before/$f.json" ] && [ -f "$W/b22/after/$f.json" ] && { echo "== $f after/before";
      python3 tools/diag/compare_runs.py "$W/b22/before/$f.json" "$W/b22/after/$f.json"; }
  done
elif [ "$part" = i1 ] || [ "$part" = i2 ] || [ "$part" = i3 ]; then
  # issue 22's "the GPU suite passes after" on branch i22 (= main + i22-py + i22-kernels: the Python/bindings and
  # kernel-side leftovers, not run before), in three calls; i3 ends with the before/after TP benches (af75616 vs
  # this tree, as b22x) because the kernels' SASS changed. The module: .carry/prebuilt-i22 (copy it to
  # .carry/prebuilt). test_consumer needs the installed package: it runs last in i3 with TANDEM_PREBUILT=0.
  case $part in
    i1) timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_tp.py \
          tests/gpu/test_tp_train.py --durations=0 ;;
    i2) timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
          tests/gpu/test_moe.py tests/gpu/test_ring_attention.py --durations=0 ;;
    i3) timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-320} )) bash tools/device_suite.sh tests/gpu/test_faults.py \
          tests/gpu/test_transport.py tests/gpu/test_torchrun.py --durations=0
        W=/tmp/i3; rm -rf "$W"; mkdir -p "$W/b22/before" "$W/b22/after" "$OUT"
        for s in before after; do
          t=$(( ($(left) - 90) / 2 )); [ "$t" -gt 140 ] && t=140  # each side its share; 90 s for test_consumer
          bench_side $s $t "$W/b22" tp -n 4 --reps 5
        done
        python3 tools/diag/compare_runs.py "$W/b22/before/tp_w4.json" "$W/b22/after/tp_w4.json"
        tar czf "$OUT/i3.tgz" -C "$W" b22
        t=$(( $(left) - 5 )); [ "$t" -gt 60 ] && TANDEM_PREBUILT=0 timeout -s INT -k 10 $t bash tools/device_suite.sh \
          tests/gpu/test_consumer.py ;;
  esac
elif [ "$part" = i4 ]; then
  # issue 22's last GPU check on main (i22 merged; test_torchrun passed at be47190): bench moe -n 2 before
  # (af75616, .carry/before) and after (the MoE kernels' SASS changed in i22: tools/diag/sass_diff.py), then
  # torch.ops.tandem.gemm with the bf16 table rebuilt after gemm-clusters (bench gemm --no-variants, issue 23)
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  W=/tmp/i4; rm -rf "$W"; mkdir -p "$W/b22" "$OUT"
  for s in before after; do
    bench_side $s ${MOE_S:-110} "$W/b22" moe -n 2 --tokens 1024,4096,16384
  done
  python3 tools/diag/compare_runs.py "$W/b22/before/moe_w2.json" "$W/b22/after/moe_w2.json"
  tar czf "$OUT/i4.tgz" -C "$W" .
  t=$(( $(left) - 50 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --no-variants --dtypes bfloat16 --out "$W/op" 2>&1 | grep -E "geometric|Error"
  tar czf "$OUT/i4.tgz" -C "$W" .
  # the op's host path in pieces (the single-call times of small shapes carry it)
  t=$(( $(left) - 40 )); [ "$t" -gt 20 ] && timeout -s INT -k 5 $t python3 tools/diag/gemm_host_path.py 2>&1 | tail -8
  # which kernels cuBLAS / cuBLASLt run at bench gemm's shapes (tile, cluster, split): where tandem trails most
  t=$(( $(left) - 5 )); [ "$t" -gt 20 ] && timeout -s INT -k 5 $t python3 tools/diag/cublas_kernels.py --fp8 \
    --out "$W/cublas_kernels.json" > /dev/null 2>&1; ls -la "$W/cublas_kernels.json" 2>&1 | tail -1
  tar czf "$OUT/i4.tgz" -C "$W" .
elif [ "$part" = mc ]; then
  # branch moe-combine-claims (not run): the combine's rows claimed by whichever blocks run (issue 26, item 3):
  # test_moe whole (the new late-block test at worlds 2 and 4 among them), then bench moe -n 2 (compare its
  # unfused column with i4's after-side run on the same machine)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-120} )) bash tools/device_suite.sh tests/gpu/test_moe.py
  W=/tmp/mc; rm -rf "$W"; mkdir -p "$W" "$OUT"
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 \
    --tokens 1024,4096,16384 --out "$W/moe" 2>&1 | tail -6
  rm -f "$W"/moe/*.png; tar czf "$OUT/mc.tgz" -C "$W" .
elif [ "$part" = hp ]; then
  # branch host-path (not run): every launch's kernel attribute set once per kernel and device, not per call
  # (runtime/launch_cache.hpp), and cuTensorMapEncodeTiled resolved once, not looked up per descriptor
  # (kernels/src/runtime/cutlass_driver_calls.cu). The launch paths of every kernel changed: test_gemm, ring
  # attention, the TP and MoE match tests; then the op's host path and bench gemm's op before (gemm-sched's module,
  # BEFORE_DIR=.carry/before-hp) and after, one call (issue 23: the op's single-call ratios at small shapes).
  S=$(( $(left) - ${BENCH_S:-300} ))
  timeout -s INT -k 20 $(( S * 3 / 5 )) bash tools/device_suite.sh tests/gpu/test_gemm.py tests/gpu/test_ring_attention.py
  timeout -s INT -k 20 $(( S - S * 3 / 5 )) bash tools/device_suite.sh tests/gpu/test_tp.py tests/gpu/test_moe.py \
    -k "test_ag_gemm_and_gemm_rs_match_torch or dispatch_gemm_and_combine_match or ffn_matches_the_layer"
  W=/tmp/hp; rm -rf "$W"; mkdir -p "$W/hp/before" "$W/hp/after" "$OUT"
  for s in before after; do
    pp=$PWD/python; [ "$s" = before ] && pp=$PWD/.carry/before-hp/python
    PYTHONPATH=$pp timeout -s INT -k 5 60 python3 tools/diag/gemm_host_path.py \
      --shapes 1000x1000x1008,777x4104x4096,4096x14336x4096 2>&1 | tail -10 | tee "$W/hp/$s/host_path.txt"
  done
  for s in before after; do
    BEFORE_DIR=.carry/before-hp bench_side $s 100 "$W/hp" gemm --reps 10 --no-variants --dtypes bfloat16
    tar czf "$OUT/hp.tgz" -C "$W" hp
  done
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --no-variants --dtypes fp8_tensor,fp8_row --out "$W/hp/after_fp8" 2>&1 | grep -E "geometric|Error"
  rm -f "$W"/hp/*/*.png; tar czf "$OUT/hp.tgz" -C "$W" hp
elif [ "$part" = nx ]; then
  # branch integ-next = main + launch-fixes + gemm-swap208 (neither run; module .carry/prebuilt-next): lf's tests
  # (every kernel family's launch path; test_gemm includes the 208 swap and the strided cases), the host path, then
  # s208's bench at the shapes furthest below cuBLAS and Nsight Compute at 777 x 4104 x 4096. Merge both if green.
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-230} )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    tests/gpu/test_ring_attention.py tests/gpu/test_tp.py tests/gpu/test_moe.py tests/cpu/test_gemm_plan.py \
    tests/cpu/test_launch_cache.py \
    -k "test_gemm or ring_attention_matches_sdpa or repeated_launches_and_cuda_graph or test_ag_gemm_and_gemm_rs_match_torch or dispatch_gemm_and_combine_match or planner or launch_cache"
  timeout -s INT -k 5 45 python3 tools/diag/gemm_host_path.py --shapes 1000x1000x1008,4096x14336x4096 2>&1 | tail -7
  worst_shapes_and_ncu nx 70
elif [ "$part" = lf ]; then
  # branch launch-fixes (not run; review of host-path and gemm-swap): the dynamic-smem cache keyed by CUDA context
  # and without the lock around the driver call, the sticky error cleared, the TMA encode forwarder under a renamed
  # symbol (+ im2col), the GEMM's cluster launch without CUTLASS's per-launch NonPortableClusterSizeAllowed, the
  # swapped configurations' raster in the problem's terms (table relabelled), and strided A / B / D in the
  # configuration test. Every kernel family's launch path: test_gemm, ring attention, TP and MoE match tests, then
  # the host path (the direct call of a cluster configuration should lose the attribute's ~0.6 us).
  timeout -s INT -k 20 $(( $(left) - 60 )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    tests/gpu/test_ring_attention.py tests/gpu/test_tp.py tests/gpu/test_moe.py \
    -k "test_gemm or ring_attention_matches_sdpa or repeated_launches_and_cuda_graph or test_ag_gemm_and_gemm_rs_match_torch or dispatch_gemm_and_combine_match"
  t=$(( $(left) - 5 )); [ "$t" -gt 50 ] && t=50
  [ "$t" -gt 20 ] && timeout -s INT -k 5 $t python3 tools/diag/gemm_host_path.py \
    --shapes 1000x1000x1008,4096x14336x4096 2>&1 | tail -7
elif [ "$part" = s208 ]; then
  # branch gemm-swap208 (not run): swap_coop_208x128_c2 again, now with CuTe's extended wgmma shapes (one 64x208x16
  # atom, not 13 of 64x16): test_gemm's configuration tests, bench gemm bf16 with every configuration at the shapes
  # furthest below cuBLAS, and Nsight Compute at 777 x 4104 x 4096 against cuBLAS (issue 23)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-200} )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    tests/cpu/test_gemm_plan.py -k "variants or op_runs or structured or planner"
  worst_shapes_and_ncu s208 80
elif [ "$part" = sw2 ]; then
  # integ-next (swap_coop_208x128_c2 in): bench gemm bf16 with every configuration and two schedules, the table
  # rebuilt from it (+ the FP8 rows of docs/results/gemm_sched/fp8_schedules.json), the op with that table (issue 23)
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/sw2; rm -rf "$W"; mkdir -p "$W/sw2" "$OUT"
  t=$(( $(left) - 150 )); [ "$t" -gt 300 ] && t=300
  [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 --dtypes bfloat16 \
    --schedules 2 --out "$W/sw2/bf16" 2>&1 | grep -E "geometric|best|Error"
  rm -f "$W"/sw2/*/*.png; tar czf "$OUT/sw2.tgz" -C "$W" sw2
  python3 -m tandem tune gemm --from-bench "$W/sw2/bf16/gemm_w1.json" docs/results/gemm_sched/fp8_schedules.json \
    --out python/tandem/ops/gemm_tune_h100.json | tail -1
  cp python/tandem/ops/gemm_tune_h100.json "$W/sw2/"
  t=$(( $(left) - 10 )); [ "$t" -gt 120 ] && t=120
  [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 --no-variants \
    --dtypes bfloat16 --out "$W/sw2/op_bf16" 2>&1 | grep -E "geometric|Error"
  rm -f "$W"/sw2/*/*.png; tar czf "$OUT/sw2.tgz" -C "$W" sw2
elif [ "$part" = res ]; then
  # issue 21: why one rank's fused grid is never fully resident under MPS (14 of 32 blocks late at world 4, 36 of
  # 66 at world 2; not 2-CTA cluster placement: 1-CTA clusters were as late, 2026-12-06 14:20). The residency
  # probe (1-CTA clusters, the core's shared memory, every rank at once) at several grid sizes, with the SMs of the
  # first wave and of the late blocks; then the core's configurations and cuBLAS on the AG+GEMM rank GEMMs under
  # MPS (which configuration is fastest per SM on a 32-SM share: the fused kernels use coop_128x256_c2 only).
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/res; rm -rf "$W"; mkdir -p "$W/res/w4" "$W/res/w2" "$W/res/w4g" "$OUT"
  timeout -s INT -k 10 120 python3 -m tandem.launch -n 4 -- python3 tools/diag/gemm_mps.py --shapes "" \
    --probe-grids 8,16,18,24,28,30,32 --out "$W/res/w4" 2>&1 | grep -E "residency|Error" | cut -c1-260
  timeout -s INT -k 10 120 python3 -m tandem.launch -n 2 -- python3 tools/diag/gemm_mps.py --shapes "" \
    --probe-grids 30,36,48,56,62,66 --out "$W/res/w2" 2>&1 | grep -E "residency|Error" | cut -c1-260
  tar czf "$OUT/res.tgz" -C "$W" res
  t=$(( $(left) - 10 )); [ "$t" -gt 240 ] && t=240
  [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- python3 tools/diag/gemm_mps.py \
    --shapes 16384x2048x4096,16384x7168x8192,16384x8192x1024 --reps 3 --out "$W/res/w4g" 2>&1 | grep -E "^\||Error" | cut -c1-600
  tar czf "$OUT/res.tgz" -C "$W" res
elif [ "$part" = ovs ]; then
  # issue 21: the fused kernels and the core on grids larger than the rank's MPS share. Under MPS one rank's
  # persistent grid is never fully resident (14 of 32 blocks late at world 4), and the core on the share ran
  # 1.3-1.4x cuBLAS at the TP ops' rank GEMMs (tp_grid_mps.json). The fused kernels are deadlock-free with blocks
  # that never get an SM (docs/fused-kernels.md, Residency), so a grid of the whole device's SMs is legal: the
  # hardware then hands the GEMM role's tiles (claimed, not strided) to whichever SMs free up. First the residency
  # probe and the core's configurations against cuBLAS under MPS (gemm_mps.py, incl. the core on all 132 SMs), then
  # tp_trace with sm_count = the share, 66 and 132, at worlds 4 and 2.
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/ovs; rm -rf "$W"; mkdir -p "$W/ovs/mps4" "$W/ovs/w4" "$W/ovs/w2" "$OUT"
  timeout -s INT -k 10 150 python3 -m tandem.launch -n 4 -- python3 tools/diag/gemm_mps.py \
    --shapes 16384x2048x4096,16384x8192x1024 --probe-grids 16,18,24,32 --reps 3 --out "$W/ovs/mps4" 2>&1 \
    | grep -E "^\||residency|Error" | cut -c1-700
  tar czf "$OUT/ovs.tgz" -C "$W" ovs
  for w in 4 2; do
    t=$(( ($(left) - 10) / (w == 4 ? 2 : 1) )); [ "$t" -gt 170 ] && t=170
    [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n $w -- python3 tools/diag/tp_trace.py \
      --shapes 16384x8192x4096 --ops ag_gemm,gemm_rs --comm-blocks 2,4 --sm-counts 0,66,132 --reps 5 \
      --out "$W/ovs/w$w" 2>&1 | grep -E "fused|late|Error" | cut -c1-300 | tail -30
    tar czf "$OUT/ovs.tgz" -C "$W" ovs
  done
elif [ "$part" = agt ]; then
  # branch ag-tiles (not run): the fused GEMM roles (AG+GEMM, GEMM+RS/AR) in 256x128 tiles (TANDEM_TP_GEMM_TILE=
  # 256x128; issue 21: the fused roles run the core's 128x256 only, and under MPS the core's 256x128 was faster
  # than cuBLAS at a rank GEMM where 128x256 was not). Its tests, then tp_trace at worlds 4 and 2 with both tiles.
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-330} )) bash tools/device_suite.sh tests/gpu/test_tp.py \
    -k "256x128_tiles or tile_claims or test_ag_gemm_and_gemm_rs_match_torch or in_pieces"
  W=/tmp/agt; rm -rf "$W"; mkdir -p "$W/agt/w4" "$W/agt/w2" "$OUT"
  for w in 4 2; do
    t=$(( ($(left) - 10) / (w == 4 ? 2 : 1) )); [ "$t" -gt 150 ] && t=150
    [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n $w -- python3 tools/diag/tp_trace.py \
      --shapes 16384x8192x4096,8192x8192x28672 --ops ag_gemm,gemm_rs --comm-blocks 2,6 \
      --variants "base;TANDEM_TP_GEMM_TILE=256x128" --reps 5 --out "$W/agt/w$w" 2>&1 | grep -E "fused|late" | tail -32
    tar czf "$OUT/agt.tgz" -C "$W" agt
  done
elif [ "$part" = share ]; then
  # issue 21: a launcher share at which every rank's grid is resident at once. At 25 % (32 SMs a rank) one rank of
  # four starts on 18 SMs in every launch (2026-12-06 16:53, 114 of 132 SMs in use; world 2: 30 of 66). The probe
  # at smaller shares (TANDEM_SM_PERCENT), then at the first share with no late rank: tp_trace, and bench tp's
  # naive pipeline against fused at that share (the same share for both, so the comparison stays fair).
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/share; rm -rf "$W"; mkdir -p "$W/share" "$OUT"
  # probe_shares WORLD GRIDS PCT...: the residency probe at each launcher share, one line a share
  probe_shares() {
    local w=$1 grids=$2 pct; shift 2
    for pct in "$@"; do
      mkdir -p "$W/share/w${w}p$pct"
      TANDEM_SM_PERCENT=$pct timeout -s INT -k 10 60 python3 -m tandem.launch -n $w -- python3 tools/diag/gemm_mps.py \
        --shapes "" --probe-grids $grids --out "$W/share/w${w}p$pct" > "$W/share/w${w}p$pct/log" 2>&1
      python3 - "$W/share/w${w}p$pct" $w $pct $grids <<'PY'
import json, glob, sys
runs = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/*.json"))]
late = [[p.get("late_blocks") for p in r["residency"]] for r in runs]
print(f"world {sys.argv[2]}, share {sys.argv[3]} %: SMs a rank {[r['sm_count'] for r in runs]}; late CTAs per rank "
      f"and probe (share/c1, share/c2, device/c2, {sys.argv[4]}): {late}")
PY
    done
  }
  probe_shares 4 24,26,28,30 20 21 22 23 24
  # world 2: at 50 % the second rank starts on 30 of its 66 SMs (96 of 132 in use)
  probe_shares 2 40,44,48,52 36 40 45
  tar czf "$OUT/share.tgz" -C "$W" share
  # the other way to the same end, at the default 25 %: grids of 28 of the 32 SMs (4 x 28 = 112 <= 114), which
  # GEMM+RS/AR already use at 4 ranks a GPU (tp_plan.fused_grid_sms) and AG+GEMM does not
  timeout -s INT -k 10 120 python3 -m tandem.launch -n 4 -- python3 tools/diag/tp_trace.py --shapes 16384x8192x4096 \
    --ops ag_gemm,gemm_rs --comm-blocks 2,4 --sm-counts 0,28 --reps 5 --out "$W/share/grid28" 2>&1 \
    | grep -E "^(ag_gemm|gemm_rs).*late|Error" | cut -c1-200
  tar czf "$OUT/share.tgz" -C "$W" share
  pct=${SHARE_PCT:-21}
  t=$(( $(left) - 200 )); [ "$t" -gt 150 ] && t=150
  [ "$t" -gt 40 ] && TANDEM_SM_PERCENT=$pct timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- python3 \
    tools/diag/tp_trace.py --shapes 16384x8192x4096 --ops ag_gemm,gemm_rs --comm-blocks 2,4 --reps 5 \
    --out "$W/share/trace" 2>&1 | grep -E "fused|late|Error" | cut -c1-300 | tail -12
  tar czf "$OUT/share.tgz" -C "$W" share
  t=$(( $(left) - 10 )); [ "$t" -gt 180 ] && t=180
  [ "$t" -gt 60 ] && TANDEM_SM_PERCENT=$pct timeout -s INT -k 10 $t python3 -m tandem bench tp -n 4 --reps 5 \
    --shapes 16384x8192x4096,8192x4096x8192 --out "$W/share/tp" 2>&1 | tail -12
  tar czf "$OUT/share.tgz" -C "$W" share
elif [ "$part" = ring ]; then
  # branch rs-ring (not run): the fused GEMM+RS / two-shot AR as a ring, the reduction in the GEMM's epilogues (TANDEM_RS_RING=1,
  # docs/fused-kernels.md). Its test (worlds 2-4) and the RS tests beside it, then bench tp's fused column with it
  # (the same-run ratios against naive: first, so a short call still gets them), then tp_trace with and without it at
  # worlds 2 and 4 (the ring's outputs differ from the default's in the last bits: rounding after every add)
  # (in_pieces_match / test_ag_gemm_and_gemm_rs_match_torch left for the whole suite after a merge: the call's time
  # goes to the ring's own test and its measurements). Prediction: world 2, 16384x8192x4096 within 10-20 % of
  # cuBLAS alone (1.37 ms) against 4.4 ms fused today.
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-330} )) bash tools/device_suite.sh tests/gpu/test_tp.py \
    -k "ring or tile_claims_match"
  W=/tmp/ring; rm -rf "$W"; mkdir -p "$W/ring" "$OUT"
  for w in 2 4; do
    t=$(( ($(left) - 60) / (w == 2 ? 2 : 1) )); [ "$t" -gt 100 ] && t=100
    [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n $w --reps 5 --ring \
      --shapes 16384x8192x4096,8192x4096x8192 --out "$W/ring/bench_w$w" 2>&1 | grep -E "gemm_rs|gemm_ar" | cut -c1-260
    rm -f "$W"/ring/*/*.png; tar czf "$OUT/ring.tgz" -C "$W" ring
  done
  for w in 2 4; do
    t=$(( ($(left) - 10) / (w == 2 ? 2 : 1) )); [ "$t" -gt 120 ] && t=120
    [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n $w -- python3 tools/diag/tp_trace.py \
      --shapes 16384x8192x4096,8192x8192x28672 --ops gemm_rs,gemm_ar --comm-blocks 4 \
      --variants "base;TANDEM_RS_RING=1" --reps 5 --out "$W/ring/w$w" 2>&1 | grep -E "fused|late|Error" | cut -c1-240 | tail -20
    rm -f "$W"/ring/*/*.png; tar czf "$OUT/ring.tgz" -C "$W" ring
  done
elif [ "$part" = tc ]; then
  # the GPU suite's remainder on main: test_transport whole (not run since e756288: 2026-12-07's call was cut after
  # its first 2 cases) and test_consumer (needs the installed CMake package: device_suite.sh builds, ~160 s)
  timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_transport.py \
    tests/gpu/test_consumer.py --durations=10
elif [ "$part" = rt ]; then
  # the GEMM+RS/AR ring traced on the grid the op uses at world 4 (tp_plan.fused_grid_sms: 28 of 32 SMs, every
  # rank resident) and on the whole share, against the default fused kernel: per-step wait and compute per rank
  # (trace_summaries in docs/results/rs_ring are from the whole share, where one rank had 14 late blocks)
  W=/tmp/rt; rm -rf "$W"; mkdir -p "$W/rt" "$OUT"
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  t=$(( ($(left) - 20) / 2 )); [ "$t" -gt 240 ] && t=240
  timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- python3 tools/diag/tp_trace.py \
    --shapes 16384x8192x4096,8192x8192x28672 --ops gemm_rs,gemm_ar --comm-blocks 4 --sm-counts 28,0 \
    --variants "base;TANDEM_RS_RING=1" --reps 5 --out "$W/rt/w4" 2>&1 | grep -E "fused|late|Error" | cut -c1-240 | tail -24
  tar czf "$OUT/rt.tgz" -C "$W" rt
  t=$(( $(left) - 10 )); [ "$t" -gt 150 ] && t=150
  [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n 4 --reps 5 --ring \
    --shapes 16384x8192x4096,8192x8192x28672 --out "$W/rt/bench_w4" 2>&1 | grep -E "gemm_rs|gemm_ar|Error" | cut -c1-260
  rm -f "$W"/rt/*/*.png; tar czf "$OUT/rt.tgz" -C "$W" rt
elif [ "$part" = trc ]; then
  # issue 24: bench train at worlds 4 and 2 with the new column "naive compute only" (naive's GEMMs and elementwise
  # work without its exchanges): naive / it is the most any overlap can gain at cuBLAS's GEMM speed (the target
  # asks 1.15 at world 4, 16384 tokens)
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/trc; rm -rf "$W"; mkdir -p "$W/trc" "$OUT"
  for w in 4 2; do
    t=$(( ($(left) - 10) / (w == 4 ? 2 : 1) )); [ "$t" -gt 280 ] && t=280
    [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench train -n $w --reps 5 --out "$W/trc/w$w" 2>&1 | tail -6
    rm -f "$W"/trc/*/*.png; tar czf "$OUT/trc.tgz" -C "$W" trc
  done
elif [ "$part" = gq ]; then
  # branch bwd-gqa (not run): ring attention's backward hands GQA/MQA K/V to cuDNN with their own heads (native
  # GQA) instead of repeating them to q's heads. Its gradient test (worlds 1-4: native, repeated, flash, the
  # deterministic mode), then bench attention at world 1 on the three GQA/MQA shapes of issue 25's table, native and
  # TANDEM_RING_BWD_GQA=repeat in the same call (SDPA cuDNN and flash timed in each)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-250} )) bash tools/device_suite.sh tests/gpu/test_ring_attention.py \
    -k "gradients"
  W=/tmp/gq; rm -rf "$W"; mkdir -p "$W/gq" "$OUT"
  for cfg in "8 32 8 2048" "2 32 8 8192" "1 8 1 16384"; do
    read -r bb hh kk ss <<< "$cfg"
    for mode in native repeat; do
      t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && t=40
      [ "$t" -gt 20 ] && TANDEM_RING_BWD_GQA=$mode timeout -s INT -k 5 $t python3 -m tandem bench attention -n 1 \
        --reps 5 --seqs $ss --causal yes --batch $bb --heads $hh --heads-kv $kk --out "$W/gq/${mode}_b${bb}_s$ss" \
        2>&1 | grep -E "^\| [0-9]" | sort -u | sed "s/^/$mode /" | cut -c1-200
    done
    tar czf "$OUT/gq.tgz" -C "$W" gq
  done
elif [ "$part" = abk ]; then
  # issue 25: the kernels of ring attention's world-1 backward beside SDPA's cuDNN backward (0.69-0.97 of it without
  # GQA though it is one cuDNN call: another engine, or kernels around it?), per shape and path
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  mkdir -p "$OUT"
  attn_bwd_kernels "$OUT/attn_bwd_kernels.jsonl" 100000 900
elif [ "$part" = mcl ]; then
  # branch moe-claims (not run): the MoE dispatch as claimed work (every block enters it; the first comm_blocks to
  # join send; every block computes, fused; no block waits for one that may lack an SM). test_moe whole (with the
  # late-block dispatch test), then bench moe at world 2, before (main: .carry/before-main, carried) and after
  carry_note=".whl .carry/prebuilt (.carry/prebuilt-moe-claims) .carry/before-main"
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-300} )) bash tools/device_suite.sh tests/gpu/test_moe.py
  W=/tmp/mc; rm -rf "$W"; mkdir -p "$W/mc" "$OUT"
  for side in before after; do
    BEFORE_DIR=.carry/before-main bench_side $side 140 "$W/mc" moe -n 2 --reps 5 --tokens 4096,16384
    tar czf "$OUT/mcl.tgz" -C "$W" mc
  done
elif [ "$part" = tk ]; then
  # branch rs-ticket (not run): GEMM+RS / two-shot GEMM+AR by tickets (TANDEM_RS_TICKET=1; each tile reduced by the
  # last rank to finish it, no waits in the GEMM). Its test at worlds 2-4 with and without late clusters, then bench
  # tp --ticket (fused default, ticket, unfused, naive in the same run) at worlds 4 and 2, a trace of world 4 (the
  # ticket kernel's per-call compute against the default kernel's), and more shapes as time allows.
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-300} )) bash tools/device_suite.sh tests/gpu/test_tp.py -k "${TK_K:-ticket}"
  W=/tmp/tk; rm -rf "$W"; mkdir -p "$W/tk" "$OUT"
  bench() {  # bench <world> <shapes> <order: - or common> <cap s>
    local t=$(( $(left) - 10 )); [ "$t" -gt "$4" ] && t=$4
    [ "$t" -gt 30 ] && env $([ "$3" = common ] && echo TANDEM_RS_ORDER=common) timeout -s INT -k 10 $t \
      python3 -m tandem bench tp -n $1 --reps 5 --ticket --shapes $2 --out "$W/tk/bench_w$1_${2%%,*}_$3" \
      2>&1 | grep -E "gemm_rs|gemm_ar|Error" | sed "s/^/w$1 $3: /" | cut -c1-300
    rm -f "$W"/tk/*/*.png; tar czf "$OUT/tk.tgz" -C "$W" tk
  }
  bench 4 16384x8192x4096,8192x4096x8192 - 110
  bench 2 16384x8192x4096 - 80
  t=$(( $(left) - 10 )); [ "$t" -gt 70 ] && t=70
  [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- python3 tools/diag/tp_trace.py \
    --shapes 16384x8192x4096 --ops gemm_rs --comm-blocks 0 --reps 3 --variants "base;TANDEM_RS_TICKET=1" \
    --out "$W/tk/trace_w4" 2>&1 | tail -14 | cut -c1-250
  tar czf "$OUT/tk.tgz" -C "$W" tk
  bench 4 2048x8192x28672,1024x4096x8192 - 100
  bench 3 12288x8192x6144 - 60
  bench 4 16384x8192x4096 common 60
elif [ "$part" = tk2 ]; then
  # branch rs-ticket2 (not run): the ticket kernel with (a) the fixup's batched loads and (b) the claimed end phase
  # (only the last eighth of the grid waits for the reduced chunks; the others copy what is ready and leave, so that
  # no block holds an SM that a late cluster of the slowest rank needs under MPS). Part tk ran rs-ticket on
  # 2026-12-07: green, ticket/unfused 1.60 at world 4 and 3.7 (RS) / 7.4 (AR) at world 2. Here: the ticket tests
  # (9 cases with the end-phase variants; TK_K to cut), bench tp --ticket at worlds 4 and 2, world 2 again with the
  # old end (TANDEM_RS_TICKET_END_WAITERS=0) and on a resident-sized grid (TANDEM_TP_FUSED_SMS=30); on an H200 the
  # FP8 op at its worst shapes with the H100 table's rows against the shipped choice; traces at worlds 2 and 4.
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-420} )) bash tools/device_suite.sh tests/gpu/test_tp.py -k "${TK_K:-ticket}"
  W=/tmp/tk2; rm -rf "$W"; mkdir -p "$W/tk2" "$OUT"
  bench() { tp_bench --ticket "$@"; }  # bench <world> <shapes> <label> <cap s> [VAR=value ...]
  trace() { tp_trace_rs $1 $2 "base;TANDEM_RS_TICKET=1;TANDEM_RS_TICKET=1,TANDEM_RS_TICKET_END_WAITERS=0" 16; }
  bench 2 16384x8192x4096 base 80
  bench 2 16384x8192x4096 end0 80 TANDEM_RS_TICKET_END_WAITERS=0
  bench 4 16384x8192x4096,8192x4096x8192 base 100
  trace 2 60
  trace 4 60
  bench 2 16384x8192x4096 sms30 70 TANDEM_TP_FUSED_SMS=30
  if nvidia-smi -L | grep -q H200; then
    for table in shipped h100; do
      t=$(( $(left) - 5 )); [ "$t" -gt 30 ] && t=30
      [ "$t" -gt 10 ] && env $([ $table = h100 ] && echo TANDEM_GEMM_TUNE_FILE=python/tandem/ops/gemm_tune_h100.json) \
        timeout -s INT -k 5 $t python3 -m tandem bench gemm --dtypes fp8_tensor,fp8_row --no-variants --reps 5 \
        --shapes 16384x28672x8192,5000x3008x8208,256x28672x8192 --out "$W/tk2/fp8_$table" 2>&1 | \
        grep -E "^\| [0-9]|geometric" | sed "s/^/$table: /" | cut -c1-160
      rm -f "$W"/tk2/*/*.png; tar czf "$OUT/tk2.tgz" -C "$W" tk2
    done
  fi
  bench 3 12288x8192x6144 base 60
  bench 4 2048x8192x28672,1024x4096x8192 base 80
elif [ "$part" = tk3 ]; then
  # branch rs-ticket3 (not run): the ticket kernel's owner stores its sums straight into its output (its end copies
  # only the tiles another rank reduced, flagged in its staging); the claimed end skips a chunk not yet reduced;
  # rounds (TANDEM_RS_TICKET_ROUNDS, off by default).
  # tk2 (2026-12-07 07:51, H100) had the end copy as the loss: world 4 RS ticket 3.56 ms (claimed end; 3.49 with the
  # old end) against 2.64 unfused, the owner's last GEMM step 0.95 ms against 0.48 for the others. Here: the ticket
  # tests (14 cases, with TANDEM_RS_TICKET_DIRECT=0: every tile through the flagged copy, and in rounds), traces at
  # worlds 4 and 2 (variants: default fused; ticket; in 4 and 2 rounds (TANDEM_RS_TICKET_ROUNDS: the owner's fixups
  # beside the next round's GEMM instead of all at the end); through the staging; in the common chunk order, whose
  # last arrivers spread over the launch; with the old end), then bench tp --ticket at worlds 4 (also in 4 rounds),
  # 2, 3. Also auto's "ticket" plan (2 tests, tandem tune) and the ring's 6 tests (its host side shares the ticket
  # kernel's per-call setup, set_step_params, since 2026-12-07 09:25).
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-300} )) bash tools/device_suite.sh tests/gpu/test_tp.py -k "${TK_K:-ticket or as_a_ring}"
  W=/tmp/tk3; rm -rf "$W"; mkdir -p "$W/tk3" "$OUT"
  bench() { tp_bench --ticket "$@"; }  # bench <world> <shapes> <label> <cap s> [VAR=value ...]
  trace() {
    tp_trace_rs $1 $2 "base;TANDEM_RS_TICKET=1;TANDEM_RS_TICKET=1,TANDEM_RS_TICKET_ROUNDS=4;TANDEM_RS_TICKET=1,TANDEM_RS_TICKET_ROUNDS=2;TANDEM_RS_TICKET=1,TANDEM_RS_TICKET_DIRECT=0;TANDEM_RS_TICKET=1,TANDEM_RS_ORDER=common;TANDEM_RS_TICKET=1,TANDEM_RS_TICKET_END_WAITERS=0" 36
  }
  trace 4 90
  bench 4 16384x8192x4096,8192x4096x8192 big 80
  bench 4 16384x8192x4096,8192x4096x8192 rounds4 70 TANDEM_RS_TICKET_ROUNDS=4
  trace 2 70
  bench 2 16384x8192x4096 big 50
  bench 3 12288x8192x6144 big 50
  bench 4 2048x8192x28672,1024x4096x8192 small 60
  # auto's plan "ticket": tandem tune times it beside the other modes (1, 2, 4 rounds) and tables the fastest
  t=$(( $(left) - 5 )); [ "$t" -gt 90 ] && t=90
  [ "$t" -gt 20 ] && timeout -s INT -k 5 $t python3 -m tandem tune -n 4 --reps 5 \
    --shapes 16384x8192x4096,8192x4096x8192 --out "$W/tk3/tune_w4.json" 2>&1 | grep -E "best|tuned|Error" | cut -c1-250
  tar czf "$OUT/tk3.tgz" -C "$W" tk3
elif [ "$part" = tk4 ]; then
  # issue 21, measurements only (main, no new code): (1) the ticket kernel traced on the fused grid the bench uses
  # at world 4 (28 SMs a rank: every rank's clusters resident) with 10 reps, RS and AR, its default end and every
  # block waiting (END_WAITERS=0: measured at world 2 only, where the grid is not resident) -- tk3's traces ran on
  # 32 SMs with 2 reps, where one rank's late blocks decided every variant; (2) bench tp --ticket at world 4 with
  # END_WAITERS=0; (3) the pipelined mode at world 4 with 1 and 4 row pieces a chunk and with the copy kernel
  # instead of the copy engines (it beat unfused at worlds 2-3 but not 4 on 2026-12-07).
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/tk4; rm -rf "$W"; mkdir -p "$W/tk4" "$OUT"
  t=$(( $(left) - 20 )); [ "$t" -gt 150 ] && t=150
  [ "$t" -gt 30 ] && timeout -s INT -k 5 $t python3 -m tandem.launch -n 4 -- python3 tools/diag/tp_trace.py \
    --shapes 16384x8192x4096 --ops gemm_rs,gemm_ar --comm-blocks 0 --sm-counts 28 --reps 10 \
    --variants "base;TANDEM_RS_TICKET=1;TANDEM_RS_TICKET=1,TANDEM_RS_TICKET_END_WAITERS=0" \
    --out "$W/tk4/trace_w4_28" 2>&1 | grep -E "^gemm_|span" | cut -c1-250
  tar czf "$OUT/tk4.tgz" -C "$W" tk4
  tp_bench --ticket 4 16384x8192x4096 end0 75 TANDEM_RS_TICKET_END_WAITERS=0
  tp_bench "" 4 16384x8192x4096 split1 75 TANDEM_PIPELINE_SPLITS=1
  tp_bench "" 4 16384x8192x4096 split4 75 TANDEM_PIPELINE_SPLITS=4
  tp_bench "" 4 16384x8192x4096 copysm 75 TANDEM_PIPELINE_COPY=sm
  # the core against cuBLAS on the share at the GEMM+RS rank GEMM (every rank at once, 20 reps; tk3's trace had
  # the core 1.5x cuBLAS on 3 of 4 ranks with 2 reps, mps_grids 1.08x): what the ticket kernel's GEMM can reach
  t=$(( $(left) - 5 )); [ "$t" -gt 120 ] && t=120
  [ "$t" -gt 30 ] && timeout -s INT -k 5 $t python3 -m tandem.launch -n 4 -- python3 tools/diag/gemm_mps.py \
    --shapes 16384x8192x1024 --reps 20 --out "$W/tk4/gemm_mps" 2>&1 | tail -14 | cut -c1-200
  tar czf "$OUT/tk4.tgz" -C "$W" tk4
elif [ "$part" = an1 ]; then
  # issue 25: Nsight Compute on tandem's forward and SDPA cuDNN's at the two shapes furthest behind (B 8, S 2048,
  # 32/8 heads, causal: 0.61-0.69 of cuDNN; B 1, S 8192, 16/16, non-causal: 0.77-0.79), one launch of each
  # (tools/diag/attn_ncu.py), side by side: what cuDNN's kernel does better (tensor pipe, stalls, issue slots,
  # grid and occupancy) decides the next change to the forward kernel.
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/an1; rm -rf "$W"; mkdir -p "$W/an1" "$OUT"
  for shape in "--batch 8 --seq 2048 --heads 32 --heads-kv 8 --causal" "--batch 1 --seq 8192 --heads 16 --heads-kv 16"; do
    name=$(echo $shape | tr -dc 'a-z0-9' | cut -c1-40)
    t=$(( $(left) - 10 )); [ "$t" -gt 150 ] && t=150
    [ "$t" -gt 30 ] && timeout -s INT -k 5 $t python3 -m tandem.launch -n 1 -- ncu --clock-control none --nvtx \
      --nvtx-include "profile/" --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
      python3 tools/diag/attn_ncu.py $shape > "$W/an1/ncu_$name.txt" 2>&1
    grep -E "max \||Duration|Compute \(SM\) Throughput|Issue Slots Busy|Grid Size|Registers Per|Achieved Occ|  [a-z_]*(ring|cudnn|fmha|sm90)[a-z_0-9]*" \
      "$W/an1/ncu_$name.txt" | cut -c1-160 | head -24
    tar czf "$OUT/an1.tgz" -C "$W" an1
  done
elif [ "$part" = ai ]; then
  # branch attn-items (issue 25; not run): the forward's per-item costs -- 1/l folded into the merge weight (d128
  # SASS 72 instructions fewer, spills unchanged), no item-end barrier at world 1 (the two ping-pong warpgroups no
  # longer realign at every item: B8 S2048 causal has 31 items an SM). The forward tests, then
  # tools/diag/attn_fwd_table.py (issue 25's 7 shapes, forward only, against cuDNN and flash) before (main's python
  # and module in .carry/before: tools/prebuild_before.sh <main>) and after, twice each, alternating.
  W=/tmp/ai; rm -rf "$W"; mkdir -p "$W/ai" "$OUT"
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-260} )) bash tools/device_suite.sh tests/gpu/test_ring_attention.py \
    tests/cpu/test_ring_layouts.py -k "not gradients and not backward" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
  for run in 1 2; do
    for side in before after; do
      pp=$PWD/python; c=${TANDEM_COMMIT:-unknown}
      [ $side = before ] && { pp=$PWD/.carry/before/python; c=$(cat .carry/before/COMMIT); }
      t=$(( $(left) - 10 )); [ "$t" -gt 60 ] && t=60
      [ "$t" -gt 20 ] && PYTHONPATH=$pp TANDEM_COMMIT=$c timeout -s INT -k 5 $t python3 -m tandem.launch -n 1 -- \
        python3 tools/diag/attn_fwd_table.py --reps 20 --label ${side}_$run --out "$W/ai" 2>&1 | \
        grep -E "geometric|B8 S2048|Error" | cut -c1-200
      tar czf "$OUT/ai.tgz" -C "$W" ai
    done
  done
elif [ "$part" = kt ]; then
  # 2026-12-07 20:30, branch attn-key-tile (issue 25; not run): the forward's K/V tile as a plan field (128 by
  # default, 176 -- FlashAttention-3's for non-causal head_dim 128, one Q stage then -- opt-in by
  # TANDEM_RING_KEY_TILE), the mask test once per work item (first_masked_tile), and (21:50) the K / V stage of
  # the consumers' wgmma as a compile-time index at d 128 (no local memory left in the d 128 / 128 kernel; main:
  # 47 local loads, 29 stores). The attention tests (both tiles forced at worlds 1-3, the rest with the default),
  # then tools/diag/attn_fwd_table.py: both tiles as interleaved columns of one process, and, where .carry/before
  # holds main's python/ and module (COMMIT inside), main's kernel before each, twice. Read: branch tile 128 vs
  # main (the spills and the mask test), tile 176 vs 128 at the non-causal d 128 rows (make it the default there
  # if it wins: key_tile_of in ring_attention_sm90.cu).
  W=/tmp/kt; rm -rf "$W"; mkdir -p "$W/kt" "$OUT"
  # (tests/cpu/test_ring_layouts.py is left to the CPU machines: on 2026-12-07 it was cut by this call's limit)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-260} )) bash tools/device_suite.sh tests/gpu/test_ring_attention.py \
    2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
  for run in 1 2; do
    for side in before after; do
      side_tree $side || continue
      tiles=0,128,176  # 0: key_tile_of's choice
      [ $side = before ] && tiles=128
      t=$(( $(left) - 10 )); [ "$t" -gt 75 ] && t=75
      [ "$t" -gt 20 ] && PYTHONPATH=$pp TANDEM_COMMIT=$c timeout -s INT -k 5 $t python3 -m tandem.launch -n 1 -- \
        python3 tools/diag/attn_fwd_table.py --reps 20 --rounds 3 --long --key-tiles $tiles --label ${side}_$run \
        --out "$W/kt" 2>&1 | grep -E "geometric|full|B8 S2048|Error" | cut -c1-220
      tar czf "$OUT/kt.tgz" -C "$W" kt
    done
  done
elif [ "$part" = rif ]; then
  # 2026-12-07 22:10, branch rs-inflight (issue 21; not run): the reduction role streams 64 bytes a thread in
  # flight, not 128 -- at 128 the GEMM+RS kernel spilled the loaded vectors and source pointers to local memory
  # (SASS: 545-578 local loads in the widest variants, 296-301 with 64). Its GEMM+RS / AR tests, then bench tp at
  # worlds 4 and 2 on two shapes (fused, unfused, pipelined columns: all use the role), main's module before
  # (.carry/before) and the branch after, alternating, twice.
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/rif; rm -rf "$W"; mkdir -p "$W/rif" "$OUT"
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-360} )) bash tools/device_suite.sh tests/gpu/test_tp.py \
    -k "match_torch or fixed_order" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
  for run in 1 2; do
    for side in before after; do
      [ $side = before ] && [ ! -d .carry/before/python ] && continue
      for w in 4 2; do
        if [ $side = before ]; then
          tp_bench "" $w 16384x8192x4096,8192x28672x8192 ${side}_$run 80 PYTHONPATH=$PWD/.carry/before/python \
            TANDEM_COMMIT=$(cat .carry/before/COMMIT)
        else
          tp_bench "" $w 16384x8192x4096,8192x28672x8192 ${side}_$run 80
        fi
      done
    done
  done
elif [ "$part" = mfc ]; then
  # 2026-12-07 19:20, issue 26, any card: tools/diag/moe_fusion_ceiling.py (not run yet) at worlds 2, 1 and 4: the
  # layer against its GEMMs alone, columns interleaved; layer / gemms is the most any fusion keeping these GEMMs can
  # gain on this machine (issue 26 asks 1.3x at 4k-16k tokens): decides whether the fused layer can meet it here.
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/mfc; rm -rf "$W"; mkdir -p "$W/mfc" "$OUT"
  moe_fusion_ceiling "" 200
elif [ "$part" = tpr4 ] || [ "$part" = tpr2 ]; then
  # 2026-12-07 19:05, issue 21: bench tp whole (21 rows) at world 4 (tpr4) or 2 (tpr2) with the columns interleaved
  # (--rounds 3), for docs/results/tp_w4.json / tp_w2.json and the card's TP table: then, here,
  #   python -m tandem tune --from-bench <tpr>/tp_w<W>.json --out python/tandem/ops/tp_tune_<h100|h200>.json
  # (the tables' other rows are from 08d31dd, 2026-12-05, timed in blocks).
  w=${part#tpr}
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/$part; rm -rf "$W"; mkdir -p "$W/$part" "$OUT"
  t=$(( $(left) - 10 ))
  [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n $w --reps 6 --rounds 3 \
    --out "$W/$part" 2>&1 | grep -E "^\| |Error" | cut -c1-220 | tail -24
  rm -f "$W/$part"/*.png; tar czf "$OUT/$part.tgz" -C "$W" "$part"
elif [ "$part" = g23 ]; then
  # 2026-12-07 19:10, issue 23 in one H200 call (machines come rarely): the bf16 sweep at the 24 shapes (gemm_sweep_halves,
  # 6 reps, at most 360 s), `tune gemm --from-bench` into python/tandem/ops/gemm_tune_h200.json here on the
  # device, then the ops as a user calls them with that table (bench gemm --no-variants, bf16 then FP8, columns
  # interleaved). The new table comes back in g23.tgz (copy it into python/tandem/ops/ and commit it).
  nvidia-smi -L | grep -q H200 || { echo "part $part wants an H200 (the H100 table has its rows)"; exit 2; }
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/g23; rm -rf "$W"; mkdir -p "$W/g23" "$OUT"
  gemm_sweep_halves bfloat16 6 $(( $(date +%s) + 360 )) sweep_ "" --rounds 1
  cp python/tandem/ops/gemm_tune_h200.json "$W/g23/gemm_tune_h200.before.json"
  python3 -m tandem tune gemm --from-bench "$W"/g23/sweep_*/gemm_w1.json --out python/tandem/ops/gemm_tune_h200.json \
    2>&1 | tail -2
  cp python/tandem/ops/gemm_tune_h200.json "$W/g23/gemm_tune_h200.json"
  tar czf "$OUT/g23.tgz" -C "$W" g23
  for dt in bfloat16 fp8_tensor,fp8_row; do
    t=$(( $(left) - 10 )); [ $dt = bfloat16 ] && t=$(( t * 4 / 10 ))
    [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 --no-variants --dtypes $dt \
      --out "$W/g23/op_${dt%%,*}" 2>&1 | grep -E "geometric|Error"
    rm -f "$W/g23"/*/*.png; tar czf "$OUT/g23.tgz" -C "$W" g23
  done
elif [ "$part" = msc ]; then
  # 2026-12-08 00:00, branch moe-stage-combine (issue 26; not run): the MoE stage copy with 8 loads in flight a
  # thread on 4 blocks a planned SM (was 32 blocks, one load-then-store: ~2 of dispatch_rows' 2.8 ms at 4096
  # DeepSeek tokens), and the combine's weighted sum loading 8 slots' ids, weights and rows before adding (was 2 x
  # topk dependent round trips a vector; the same fp32 sums in the same order). test_moe whole, then
  # moe_fusion_ceiling.py (dispatch, combine, layer columns) at worlds 1 and 2, main's module (.carry/before) and
  # the branch's alternating.
  W=/tmp/msc; rm -rf "$W"; mkdir -p "$W/msc" "$OUT"
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-300} )) bash tools/device_suite.sh tests/gpu/test_moe.py \
    2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
  for w in 1 2; do
    for side in before after; do
      side_tree $side || continue
      t=$(( $(left) - 10 )); [ "$t" -gt 70 ] && t=70
      [ "$t" -gt 25 ] && PYTHONPATH=$pp TANDEM_COMMIT=$c timeout -s INT -k 5 $t python3 -m tandem.launch -n $w -- \
        python3 tools/diag/moe_fusion_ceiling.py --tokens 4096,16384 --reps 8 --out "$W/msc/${side}_w$w" 2>&1 | \
        grep -E "tokens w|Error|error" | sed "s/^/$side: /" | cut -c1-300
      tar czf "$OUT/msc.tgz" -C "$W" msc
    done
  done
elif [ "$part" = abh ]; then
  # 2026-12-07 23:50, issue 25, any card: where the world-1 backward's host time goes (part dx measured 750-870 us
  # to enqueue one tandem backward against SDPA cuDNN's 380-500, with the same cuDNN kernels): the top 30
  # functions by cumulative host time, per call, for SDPA and tandem at two shapes (JSON lines in abh.tgz).
  # On branch attn-bwd-host (its world-1 path without slices and no-op casts): its gradient tests first.
  W=/tmp/abh; rm -rf "$W"; mkdir -p "$W/abh" "$OUT"
  timeout -s INT -k 10 120 bash tools/device_suite.sh tests/gpu/test_ring_attention.py -k gradients 2>&1 | \
    grep -E "passed|failed|FAILED|Error" | tail -4
  t=$(( $(left) - 10 )); [ "$t" -gt 150 ] && t=150
  timeout -s INT -k 10 $t python3 -m tandem.launch -n 1 -- python3 tools/diag/attn_bwd_kernels.py \
    --shapes 1/16/16/128/8192/1,8/32/8/128/2048/1 --host-profile 30 --out "$W/abh/attn_bwd_host.jsonl" 2>&1 | \
    python3 -c "
import json, sys
for line in sys.stdin:
    try: r = json.loads(line)
    except ValueError: print(line.rstrip()[:200]); continue
    print(r['shape'], r['path'], 'host', r['host_us'], '|', '; '.join(f\"{p['fn'][:60]} {p['cumtime_us']}/{p['tottime_us']}\" for p in r.get('host_profile', [])[:18])[:1400])"
  tar czf "$OUT/abh.tgz" -C "$W" abh
  # the branch's bench attention (back-to-back columns) at two shapes, the rest of the call
  for args in "--seqs 8192 --causal yes" "--batch 8 --heads 32 --heads-kv 8 --seqs 2048 --causal yes"; do
    t=$(( $(left) - 10 )); [ "$t" -gt 120 ] && t=120
    [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench attention -n 1 $args --out "$W/abh/bench" \
      2>&1 | grep -E "^\| |Error" | cut -c1-220
    rm -f "$W/abh/bench"/*.png; mkdir -p "$W/abh/b_${args// /_}"; mv "$W/abh/bench"/* "$W/abh/b_${args// /_}/" 2>/dev/null
    tar czf "$OUT/abh.tgz" -C "$W" abh
  done
elif [ "$part" = dx ]; then
  # 2026-12-07 19:10, any card, one call: part mfc (issue 26: the MoE layer against its GEMMs alone, worlds 2 and
  # 1; world 4 if time is left) and part abk (issue 25: the world-1 backward's kernels beside cuDNN's).
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/dx; rm -rf "$W"; mkdir -p "$W/dx" "$OUT"
  attn_bwd_kernels "$W/dx/attn_bwd_kernels.jsonl" 110 700
  tar czf "$OUT/dx.tgz" -C "$W" dx
  moe_fusion_ceiling mfc_ 180
elif [ "$part" = f8ab ]; then
  # 2026-12-07 16:50: parts f8a and f8b in one call (machines come rarely; a start costs 90 s or more): f8a's 12
  # shapes in at most half the call, then f8b's in the rest, 8 reps; each half keeps its partial rows if cut. Then,
  # here: python -m tandem tune gemm --from-bench <a>/gemm_w1.json <b>/gemm_w1.json into gemm_tune_h200.json.
  nvidia-smi -L | grep -q H200 || { echo "part $part wants an H200 (the H100 table has its FP8 rows)"; exit 2; }
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/f8ab; rm -rf "$W"; mkdir -p "$W/f8ab" "$OUT"
  gemm_sweep_halves fp8_tensor,fp8_row 8 $(( start + CALL_S - 15 )) "" fp8
elif [ "$part" = ps ]; then
  # 2026-12-07 (evening), issue 21, any card: the pipelined mode at world 2 where the overlap ceiling is within
  # 1.15 of max(cuBLAS, collective) (docs/results.md: 8192x28672x8192 RS 1.05; AG+GEMM 16384x8192x4096 and the
  # Llama up projection): pipelined was 1.24x the bar with 2 row pieces a chunk; pieces 1 / 2 / 4 / 8 here.
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/ps; rm -rf "$W"; mkdir -p "$W/ps" "$OUT"
  for sp in 2 4 8 1; do
    tp_bench "" 2 8192x28672x8192,16384x8192x4096,16384x14336x8192 splits$sp 125 TANDEM_PIPELINE_SPLITS=$sp
  done
elif [ "$part" = br ]; then
  # 2026-12-07 (evening), issue 21, any card: bench tp with its columns interleaved in rounds (97e4374, not run):
  # rounds 3 against 1 (the old blocks), alternating, twice each, world 2 at two shapes of part ps, then world 4
  # once with rounds 3; the JSON's spread says how much each column drifted between rounds.
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/br; rm -rf "$W"; mkdir -p "$W/br" "$OUT"
  for run in 1 2; do
    for ro in 3 1; do
      tp_bench "--rounds $ro" 2 8192x28672x8192,16384x8192x4096 r${ro}_$run 100
    done
  done
  tp_bench "--rounds 3" 4 16384x8192x4096,8192x28672x8192 r3_w4 150
elif [ "$part" = h23 ]; then
  # 2026-12-07 (evening): issue 23 on an H200 after part f8ab's sweep became the H200 table's FP8 rows: the FP8
  # tests (scaled GEMM, FP8 TP ops), then the ops as a user calls them (bench gemm --no-variants: the table's
  # choice) over the 24 shapes, FP8 both scalings then bf16, each against its baseline in the same run.
  nvidia-smi -L | grep -q H200 || { echo "part $part wants an H200 (the H200 table is what it times)"; exit 2; }
  W=/tmp/h23; rm -rf "$W"; mkdir -p "$W/h23" "$OUT"
  t=$(( $(left) - ${BENCH_S:-300} )); [ "$t" -gt 200 ] && t=200
  timeout -s INT -k 10 $t bash tools/device_suite.sh tests/gpu/test_gemm.py tests/gpu/test_tp.py \
    -k "scaled or fp8" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
  for dt in fp8_tensor,fp8_row bfloat16; do
    t=$(( $(left) - 10 )); [ $dt != bfloat16 ] && t=$(( t * 6 / 10 ))
    [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 --no-variants --dtypes $dt \
      --out "$W/h23/op_${dt%%,*}" 2>&1 | grep -E "geometric|lowest|Error"
    rm -f "$W/h23"/*/*.png; tar czf "$OUT/h23.tgz" -C "$W" h23
  done
elif [ "$part" = f8a ] || [ "$part" = f8b ]; then
  # issue 23 on an H200: every FP8 configuration and schedule at half of bench gemm's 24 shapes each (one call of
  # all 24 ran past 330 s on 2026-12-07), for the H200 table's FP8 rows (gemm_tune_h200.json has bf16 rows only):
  # python -m tandem tune gemm --from-bench <f8a>/gemm_w1.json <f8b>/gemm_w1.json, then merged into the table
  nvidia-smi -L | grep -q H200 || { echo "part $part wants an H200 (the H100 table has its FP8 rows)"; exit 2; }
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  S=$(gemm_half_shapes ${part#f8} fp8)
  W=/tmp/$part; rm -rf "$W"; mkdir -p "$W/$part" "$OUT"
  timeout -s INT -k 10 $(( $(left) - 15 )) python3 -m tandem bench gemm --dtypes fp8_tensor,fp8_row --reps 10 \
    --shapes $S --out "$W/$part" 2>&1 | grep -E "geometric|best|Error"
  rm -f "$W/$part"/*.png; tar czf "$OUT/$part.tgz" -C "$W" "$part"
elif [ "$part" = rings ]; then
  # part ring cut to a short call (little device time left): the ring's own test, then bench tp --ring at one
  # shape, worlds 2 and 4 (fused, ring and naive in the same run)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-120} )) bash tools/device_suite.sh tests/gpu/test_tp.py -k "ring"
  W=/tmp/ring; rm -rf "$W"; mkdir -p "$W/ring" "$OUT"
  for w in 2 4; do
    t=$(( ($(left) - 10) / (w == 2 ? 2 : 1) ))
    [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n $w --reps 5 --ring \
      --shapes 16384x8192x4096 --out "$W/ring/bench_w$w" 2>&1 | grep -E "gemm_rs|gemm_ar|Error" | cut -c1-260
    rm -f "$W"/ring/*/*.png; tar czf "$OUT/ring.tgz" -C "$W" ring
  done
elif [ "$part" = fp8m ]; then
  # issue 23: the FP8 table from the median of two post-overlap sweeps (docs/results/gemm_fp8_table/
  # table_median_candidate.json: gemm_fp8_overlap/sweep_partial.json + gemm_fp8_table/sweep_fp8.json, tune gemm's
  # median merge) against the shipped one (one sweep), the op at all 24 shapes, twice each, alternating.
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  W=/tmp/fp8m; rm -rf "$W"; mkdir -p "$W/fp8m" "$OUT"; T=python/tandem/ops/gemm_tune_h100.json
  cp $T "$W/shipped.json"
  for run in 1 2; do
    for side in shipped median; do
      [ $side = median ] && cp docs/results/gemm_fp8_table/table_median_candidate.json $T || cp "$W/shipped.json" $T
      t=$(( $(left) - 15 )); [ "$t" -gt 100 ] && t=100
      [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --dtypes fp8_tensor,fp8_row --no-variants \
        --reps 10 --out "$W/fp8m/${side}_$run" 2>&1 | grep -E "geometric" | sed "s/^/$side $run: /"
      rm -f "$W"/fp8m/*/*.png; tar czf "$OUT/fp8m.tgz" -C "$W" fp8m
    done
  done
  cp "$W/shipped.json" $T
elif [ "$part" = tf ]; then
  # branch torch-ops-fixes (not run; a review's findings): the C++ kernels take a's device before the planner, intern
  # the configuration names (no string copy a call), decode a launch error's reason with replacement, refuse a miss
  # after Python has exited; the Python path takes a's device too. test_gemm whole (the C++ path's test) and the
  # library's CPU test, then the host path (the op's host time should not grow: 10.8-11.6 us on 2026-12-06)
  timeout -s INT -k 20 $(( $(left) - 120 )) bash tools/device_suite.sh tests/gpu/test_gemm.py tests/cpu/test_torch_ops.py
  timeout -s INT -k 5 60 python3 tools/diag/gemm_host_path.py --shapes 1000x1000x1008,777x4104x4096 2>&1 | tail -6
elif [ "$part" = to ]; then
  # branch torch-ops (not run): torch.ops.tandem.gemm / scaled_gemm through C++ kernels of torch's CUDA dispatch key
  # (python/torch_ops/, built here by device_suite.sh against this torch): test_gemm whole (with the C++ path's test:
  # same bits as the Python implementation, rejects on first and cached signatures, graph), the library's CPU test,
  # test_tp's match test; the host path (op, op through Python, direct, cuBLAS); bench gemm, the op with the shipped
  # table, bf16 then FP8, each row also timing the op through Python in the same run (issue 23)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-300} )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    tests/cpu/test_torch_ops.py tests/gpu/test_tp.py -k "test_gemm or torch_ops or test_ag_gemm_and_gemm_rs_match_torch"
  W=/tmp/to; rm -rf "$W"; mkdir -p "$W/to" "$OUT"
  timeout -s INT -k 5 60 python3 tools/diag/gemm_host_path.py --shapes 1000x1000x1008,777x4104x4096,4096x14336x4096 \
    > "$W/to/host_path.txt" 2>&1; tail -8 "$W/to/host_path.txt"
  for dt in bfloat16 fp8_tensor,fp8_row; do
    t=$(( $(left) - 10 )); [ "$t" -gt 150 ] && t=150
    [ "$t" -gt 30 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 --no-variants --dtypes $dt \
      --out "$W/to/op_${dt%%,*}" 2>&1 | grep -E "op path|geometric|Error"
    rm -f "$W"/to/*/*.png; tar czf "$OUT/to.tgz" -C "$W" to
  done
elif [ "$part" = sw ]; then
  # branch gemm-swap (not run): the swapped bf16 configurations (D^T = B^T A^T: swap_coop_256x128_c1; a 128 x 208
  # swapped tile ran here once and was dropped): test_gemm's configuration tests, bench gemm bf16 with every
  # configuration, the table tuned from it and the op with it, and Nsight Compute at 777 x 4104 x 4096 (issue 23)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-260} )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    -k "variants or op_runs or structured"
  W=/tmp/sw; rm -rf "$W"; mkdir -p "$W/sw" "$OUT"
  t=$(( $(left) - 120 )); [ "$t" -gt 170 ] && t=170
  [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 --dtypes bfloat16 \
    --schedules 2 --out "$W/sw/bf16" 2>&1 | grep -E "geometric|best|Error"
  rm -f "$W"/sw/*/*.png; tar czf "$OUT/sw.tgz" -C "$W" sw
  python3 -m tandem tune gemm --from-bench "$W/sw/bf16/gemm_w1.json" --out "$W/sw/tune.json" | tail -1
  t=$(( $(left) - 60 )); [ "$t" -gt 60 ] && t=60
  [ "$t" -gt 20 ] && timeout -s INT -k 5 $t ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:"device_kernel|nvjet" --launch-skip 0 \
    python3 tools/diag/gemm_ncu.py --shape 777x4104x4096 --calls 1 \
    --variants coop_128x256_c1,coop_128x256_c1x2,swap_coop_256x128_c1 > "$W/sw/ncu_777.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|rel\. diff" "$W/sw/ncu_777.txt" | head -40
  tar czf "$OUT/sw.tgz" -C "$W" sw
  t=$(( $(left) - 5 )); [ "$t" -gt 30 ] && TANDEM_GEMM_TUNE_FILE="$W/sw/tune.json" timeout -s INT -k 5 $t \
    python3 -m tandem bench gemm --reps 10 --no-variants --dtypes bfloat16 --out "$W/sw/op" 2>&1 | grep -E "geometric|Error"
  rm -f "$W"/sw/*/*.png; tar czf "$OUT/sw.tgz" -C "$W" sw
elif [ "$part" = gs ]; then
  # branch gemm-sched (not run): the bf16 GEMM's tile schedule (swizzle x raster) per shape; test_gemm (every
  # configuration with two other schedules, raster refusal), bench gemm bf16 with the two fastest configurations'
  # schedules, the table tuned from it, and the op with that table (TANDEM_GEMM_TUNE_FILE) in the same call
  # (test_tp's first test too: GemmArgs gained a field, which the fused kernels' GEMM arguments start from)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-330} )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    tests/gpu/test_tp.py::test_ag_gemm_and_gemm_rs_match_torch
  W=/tmp/gs; rm -rf "$W"; mkdir -p "$W" "$OUT"
  t=$(( $(left) - 60 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --dtypes bfloat16 --schedules 2 --out "$W/bf16" 2>&1 | grep -E "geometric|best|Error"
  tar czf "$OUT/gs.tgz" -C "$W" .
  python3 -m tandem tune gemm --from-bench "$W/bf16/gemm_w1.json" --out "$W/tune.json" | tail -1
  t=$(( $(left) - 10 )); [ "$t" -gt 30 ] && TANDEM_GEMM_TUNE_FILE="$W/tune.json" timeout -s INT -k 10 $t \
    python3 -m tandem bench gemm --reps 10 --no-variants --dtypes bfloat16 --out "$W/op" 2>&1 | grep -E "geometric|Error"
  tar czf "$OUT/gs.tgz" -C "$W" .
elif [ "$part" = gs8 ]; then
  # branch gemm-sched, FP8: the tile schedules of each row's fastest configuration at the shapes where the FP8 GEMM
  # trails torch._scaled_mm most (docs/results/gemm_w1_fp8.json), then the op with the table tuned from them
  W=/tmp/gs8; rm -rf "$W"; mkdir -p "$W" "$OUT"
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  S=16384x28672x8192,16384x14336x4096,1024x4096x14336,256x8192x28672,12345x4096x4096,1000x1008x1008
  t=$(( $(left) - 60 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 5 \
    --dtypes fp8_tensor,fp8_row --schedules 1 --shapes $S --out "$W/fp8" 2>&1 | grep -E "geometric|best|Error"
  tar czf "$OUT/gs8.tgz" -C "$W" .
  python3 -m tandem tune gemm --from-bench "$W/fp8/gemm_w1.json" --out "$W/tune.json" | tail -1
  t=$(( $(left) - 10 )); [ "$t" -gt 30 ] && TANDEM_GEMM_TUNE_FILE="$W/tune.json" timeout -s INT -k 10 $t \
    python3 -m tandem bench gemm --reps 10 --no-variants --dtypes fp8_tensor,fp8_row --shapes $S --out "$W/op" \
    2>&1 | grep -E "geometric|Error"
  tar czf "$OUT/gs8.tgz" -C "$W" .
elif [ "$part" = g3 ]; then
  # branch gemm-clusters (not run): bf16 configurations coop_128x256_c1x2 and coop_256x128_c2; the every-
  # configuration tests, then bench gemm bf16 with every configuration (issue 23: the ragged shapes)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-250} )) bash tools/device_suite.sh tests/gpu/test_gemm.py
  W=/tmp/g3; rm -rf "$W"; mkdir -p "$W" "$OUT"
  # the op's host time per call without the 1-byte workspace allocation (against the numbers in docs/results.md)
  timeout -s INT -k 10 60 python3 tools/diag/gemm_host_path.py 2>&1 | tail -6
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --dtypes bfloat16 --out "$W/bf16" 2>&1 | grep -E "geometric|Error"
  tar czf "$OUT/g3.tgz" -C "$W" .
elif [ "$part" = b22m ]; then
  # issue 22's MoE benchmark before (af75616, .carry/before) and after (this tree): b22x's "moe -n 2" ran out of
  # memory on an H100 at its default 65536 tokens (two ranks' 41 + 34 GiB); 1024-16384 tokens fit. Then bench gemm
  # FP8 with every configuration (fp8-tiles' 128x192 tiles, issue 23; gemm_w1.json is written after every case).
  W=/tmp/b22m; rm -rf "$W"; mkdir -p "$W/b22/before" "$W/b22/after" "$OUT"
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  for s in before after; do
    bench_side $s ${MOE_S:-110} "$W/b22" moe -n 2 --tokens 1024,4096,16384
  done
  python3 tools/diag/compare_runs.py "$W/b22/before/moe_w2.json" "$W/b22/after/moe_w2.json"
  tar czf "$OUT/b22m.tgz" -C "$W" b22
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --dtypes fp8_tensor,fp8_row --out "$W/fp8" 2>&1 | grep -E "geometric|Error"
  tar czf "$OUT/b22m.tgz" -C "$W" b22 fp8
elif [ "$part" = z2 ]; then
  D=/tmp/dn_z2; rm -rf "$D"  # outputs outside $OUT (at most 8 files come back): only diag.tgz there
  # branch integ4 = main + fp8-tiles + moe-speed (neither run before; they merge cleanly; one prebuilt module,
  # .carry/prebuilt-integ4): the tests of both, then bench gemm FP8 with every configuration (the 128x192 tiles,
  # issue 23), moe_ffn's steps at world 2 with the new defaults, with 16 dispatch blocks, with GEMM 1 by torch and
  # with the old behaviour (issue 26), then bench moe --layer. Merge each branch whose tests pass.
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-320} )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    tests/gpu/test_moe.py tests/cpu/test_typed_bindings.py --durations=0 \
    -k "scaled or swiglu or ffn or dispatch_gemm_and_combine or repeated or refused or emulated or capacity or typed or args"
  mkdir -p "$D/diag/fp8"
  t=$(( $(left) - 230 )); [ "$t" -gt 100 ] && t=100
  [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --dtypes fp8_tensor,fp8_row --out "$D/diag/fp8" 2>&1 | grep -E "geometric|Error"
  tar czf "$OUT/diag.tgz" -C "$D" diag
  for v in new b16 g1t old; do
    case $v in
      new) env_v="" ;;
      b16) env_v="TANDEM_MOE_DISPATCH_BLOCKS=16" ;;
      g1t) env_v="TANDEM_MOE_GEMM1=torch" ;;
      old) env_v="TANDEM_MOE_SWIGLU=torch TANDEM_MOE_DISPATCH_BLOCKS=8 TANDEM_MOE_WAIT_NS=0" ;;
    esac
    mkdir -p "$D/diag/$v"
    t=$(( $(left) - 60 )); [ "$t" -gt 45 ] && t=45
    [ "$t" -gt 20 ] && env $env_v timeout -s INT -k 10 $t python3 -m tandem.launch -n 2 -- \
      python3 tools/diag/moe_layer_steps.py --tokens 1024,4096 --reps 5 --out "$D/diag/$v" 2>&1 | \
      grep -E "^rank 0|Error" | head -4 | sed "s/^/$v: /"
    tar czf "$OUT/diag.tgz" -C "$D" diag
  done
  t=$(( $(left) - 5 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --layer --reps 5 \
    --tokens 1024,4096 --out "$D/diag" 2>&1 | tail -6
  tar czf "$OUT/diag.tgz" -C "$D" diag
elif [ "$part" = mc1 ]; then
  D=/tmp/dn_mc1; rm -rf "$D"  # outputs outside $OUT (at most 8 files come back): only mc1.tgz there
  # branch moe-dedup (= moe-gemm-c1 + the dispatch's token once per rank; none of it run): the unfused grouped GEMM
  # in 1x1 clusters, raster along M
  # (TANDEM_MOE_GEMM_CLUSTER=1). Why: at the DeepSeek config, 1k tokens a rank at world 2, an expert gets ~64 rows,
  # one row tile, so one block of every 2x1 cluster has no rows and half the grid streams the weights, which are
  # the GEMM's whole cost there (moe_ffn 14 ms against ~7 ms of weight reads for both ranks, 2026-12-06). Its test
  # (worlds 1-4), then moe_ffn's steps at world 2 with each kernel (the dispatch step holds GEMM 1), then bench moe
  # --layer with each (the whole op against the torch reference, same run).
  # Also GEMM 2 by tandem's grouped GEMM as its own launch (TANDEM_MOE_GEMM2=tandem; torch._grouped_mm otherwise):
  # variants t2 / t1 (GEMM 2 by tandem in 2x1 / 1x1; t1 also puts GEMM 1 in 1x1).
  # Part mc1 is these tests, mc3 the dedup's (TANDEM_MOE_DEDUP=1, each token once per destination rank, worlds 1-4
  # and 2 emulated nodes), mc2 the timings.
  timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_moe.py \
    tests/cpu/test_typed_bindings.py --durations=0 \
    -k "1x1_clusters or grouped_gemm or tandems_gemm2 or ffn_matches"
elif [ "$part" = mc3 ]; then
  # branch moe-dedup: the dispatch's token once per destination rank (its test at worlds 1-4 and across 2 emulated
  # nodes), then test_moe's dispatch cases without it (the dispatch kernel's send path changed for both)
  timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_moe.py --durations=0 \
    -k "once_per_rank or dispatch_gemm_and_combine or emulated or late_block or repeated"
elif [ "$part" = ox ]; then
  # 2026-12-07 15:40: part oc1's MoE half (branch moe-plan: its tests, bench moe --layer default plan against the old
  # defaults) and part gx (branch gemm-c2x2: the 2x2 / 4x2 cluster variants' tests, the core under MPS at world 4)
  # in one call.
  W=/tmp/ox; rm -rf "$W"; mkdir -p "$W/ox" "$OUT"
  timeout -s INT -k 20 $(( $(left) - 330 )) bash tools/device_suite.sh tests/gpu/test_moe.py tests/cpu/test_moe_ffn.py \
    tests/gpu/test_gemm.py tests/cpu/test_gemm_plan.py \
    -k "(ffn and not backward) or 1x1 or grouped_gemm_rows or gemm2_plan or variants_match or every_configuration_it_may or gemm_plan" \
    2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12
  for v in auto old; do
    if [ $v = auto ]; then env_v="TANDEM_MOE_PLAN_NOTE=auto"; else env_v="TANDEM_MOE_GEMM2=torch TANDEM_MOE_GEMM_CLUSTER=2"; fi
    mkdir -p "$W/ox/layer_$v"
    t=$(( $(left) - 110 )); [ "$t" -gt 70 ] && t=70
    [ "$t" -gt 20 ] && env $env_v timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --layer --reps 5 \
      --tokens 1024,4096 --out "$W/ox/layer_$v" 2>&1 | grep -E "^\| (small|deepseek)" | sed "s/^/$v: /"
    rm -f "$W"/ox/*/*.png; tar czf "$OUT/ox.tgz" -C "$W" ox
  done
  t=$(( $(left) - 5 )); [ "$t" -gt 100 ] && t=100
  [ "$t" -gt 30 ] && timeout -s INT -k 5 $t python3 -m tandem.launch -n 4 -- python3 tools/diag/gemm_mps.py \
    --shapes 16384x8192x1024 --reps 20 --out "$W/ox/gemm_mps_w4" 2>&1 | grep -E "^\| [0-9]" | cut -c1-900
  tar czf "$OUT/ox.tgz" -C "$W" ox
elif [ "$part" = oc1 ]; then
  # issue 21: the overlap ceiling (tools/diag/tp_overlap_ceiling.py: cuBLAS and tandem's collective launched together
  # on two streams, no dependency, every rank at once) at worlds 4 and 2 -- the best ratio to max(cuBLAS alone,
  # collective alone) any overlapped design of these two kernels can reach under MPS on one GPU. Issue 26: the MoE
  # layer's default plan (branch moe-plan: 1x1 clusters and tandem's GEMM 2 at most one row tile an expert; not run;
  # on main the tests' plan assertions are absent and the 'auto' side runs main's defaults): the ffn tests,
  # then bench moe --layer with the default plan and with the old defaults forced (torch GEMM 2, 2x1), same call.
  W=/tmp/oc1; rm -rf "$W"; mkdir -p "$W/oc1" "$OUT"
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  for w in 4 2; do
    t=$(( $(left) - 300 )); [ "$t" -gt 75 ] && t=75
    [ "$t" -gt 20 ] && timeout -s INT -k 5 $t python3 -m tandem.launch -n $w -- python3 tools/diag/tp_overlap_ceiling.py \
      --out "$W/oc1/ceiling_w$w" 2>&1 | grep -E "ceiling|Error" | cut -c1-300
    tar czf "$OUT/oc1.tgz" -C "$W" oc1
  done
  timeout -s INT -k 20 $(( $(left) - 110 )) bash tools/device_suite.sh tests/gpu/test_moe.py tests/cpu/test_moe_ffn.py \
    -k "(ffn and not backward) or 1x1 or grouped_gemm_rows or gemm2_plan" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12
  for v in auto old; do
    if [ $v = auto ]; then env_v="TANDEM_MOE_PLAN_NOTE=auto"; share=2; else env_v="TANDEM_MOE_GEMM2=torch TANDEM_MOE_GEMM_CLUSTER=2"; share=1; fi
    mkdir -p "$W/oc1/layer_$v"
    t=$(( ($(left) - 10) / share )); [ "$t" -gt 60 ] && t=60
    [ "$t" -gt 20 ] && env $env_v timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --layer --reps 5 \
      --tokens 1024,4096 --out "$W/oc1/layer_$v" 2>&1 | grep -E "^\| (small|deepseek)" | sed "s/^/$v: /"
    rm -f "$W"/oc1/*/*.png; tar czf "$OUT/oc1.tgz" -C "$W" oc1
  done
elif [ "$part" = mc2 ]; then
  D=/tmp/dn_mc1; rm -rf "$D"
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # module
  mkdir -p "$D/mc1"
  for v in c2 c1 t2 t1 d1; do
    case $v in
      d1) env_v="TANDEM_MOE_DEDUP=1" ;;
      c1*) env_v="TANDEM_MOE_GEMM_CLUSTER=1" ;;
      t2) env_v="TANDEM_MOE_GEMM2=tandem TANDEM_MOE_GEMM_CLUSTER=2" ;;
      t1) env_v="TANDEM_MOE_GEMM2=tandem TANDEM_MOE_GEMM_CLUSTER=1" ;;
      *) env_v="TANDEM_MOE_GEMM_CLUSTER=2" ;;
    esac
    mkdir -p "$D/mc1/steps_$v"
    t=$(( $(left) - 200 )); [ "$t" -gt 45 ] && t=45
    [ "$t" -gt 20 ] && env $env_v timeout -s INT -k 10 $t python3 -m tandem.launch -n 2 -- \
      python3 tools/diag/moe_layer_steps.py --tokens 1024,4096 --reps 5 --out "$D/mc1/steps_$v" 2>&1 | \
      grep -E "^rank 0|Error" | head -6 | sed "s/^/$v: /"
    tar czf "$OUT/mc1.tgz" -C "$D" mc1
  done
  for v in c2 c1 t1 d1; do
    case $v in
      d1) env_v="TANDEM_MOE_DEDUP=1" ;;
      c1) env_v="TANDEM_MOE_GEMM_CLUSTER=1" ;;
      t1) env_v="TANDEM_MOE_GEMM2=tandem TANDEM_MOE_GEMM_CLUSTER=1" ;;
      *) env_v="TANDEM_MOE_GEMM_CLUSTER=2" ;;
    esac
    mkdir -p "$D/mc1/layer_$v"
    share=1; [ $v = c2 ] && share=4; [ $v = c1 ] && share=3; [ $v = t1 ] && share=2  # an even share each
    t=$(( ($(left) - 10) / share )); [ "$t" -gt 55 ] && t=55
    [ "$t" -gt 20 ] && env $env_v timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --layer --reps 5 \
      --tokens 1024,4096 --out "$D/mc1/layer_$v" 2>&1 | grep -E "^\| (small|deepseek)" | sed "s/^/$v: /"
    rm -f "$D"/mc1/*/*.png; tar czf "$OUT/mc1.tgz" -C "$D" mc1
  done
elif [ "$part" = r2 ]; then
  D=/tmp/dn_r2; rm -rf "$D"  # outputs outside $OUT (at most 8 files come back): only diag.tgz there
  # branch ring-bwd-merge (in integ4; not run before): the ring backward with one block kernel call a step (causal:
  # the shard causally at the own step, one unmasked rectangle at the others) -- the gradient tests at worlds 1-4
  # (both block kernels, which ran), then bench attention -n 1 at the issue's causal shapes (backward and fwd+bwd
  # against SDPA cuDNN; 2026-12-06's run had the three-call schedule: docs/results.md)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-150} )) bash tools/device_suite.sh tests/gpu/test_ring_attention.py \
    --durations=0 -k "gradients or backward"
  mkdir -p "$D/diag"
  for a in "--seqs 8192,32768 --causal yes" "--seqs 2048 --causal yes --batch 8 --heads 32 --heads-kv 8" \
           "--seqs 8192 --causal yes --batch 2 --heads 32 --heads-kv 8"; do
    t=$(( $(left) - 5 )); [ "$t" -gt 60 ] && t=60
    d="$D/diag/$(echo $a | tr -dc 'a-z0-9' | cut -c1-24)"; mkdir -p "$d"
    [ "$t" -gt 20 ] && timeout -s INT -k 10 $t python3 -m tandem bench attention -n 1 --reps 5 --out "$d" $a 2>&1 | \
      grep -E "^\| [0-9]" | sort -u
    rm -f "$d"/*.png; tar czf "$OUT/diag.tgz" -C "$D" diag
  done
elif [ "$part" = m2 ]; then
  # issue 26: where moe_ffn's time goes at world 2 (tools/diag/moe_layer_steps.py: each step of the unfused chain
  # timed in the layer, the op, allocator retries), then the same at world 4
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  for n in 2 4; do
    t=$(( $(left) / 2 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n $n -- \
      python3 tools/diag/moe_layer_steps.py --out "$OUT/diag" 2>&1 | grep -E "^rank|Error" | head -20
    tar czf "$OUT/diag.tgz" -C "$OUT" diag
  done
elif [ "$part" = m3 ]; then
  # branch moe-speed (not run before): the SwiGLU kernel's test and the MoE tests around it, then moe_ffn's steps
  # at world 2 with the branch's defaults and with the old behaviour (torch SwiGLU over every capacity row, 8
  # dispatch blocks, spinning rendezvous waits), then bench moe --layer (against the 2026-12-06 table)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-230} )) bash tools/device_suite.sh tests/gpu/test_moe.py \
    tests/cpu/test_typed_bindings.py -k "swiglu or ffn or dispatch_gemm_and_combine or repeated or typed or args"
  mkdir -p "$OUT/diag/new" "$OUT/diag/old" "$OUT/diag/b16"
  t=$(( ($(left) - 80) / 3 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 2 -- \
    python3 tools/diag/moe_layer_steps.py --out "$OUT/diag/new" 2>&1 | grep -E "^rank|Error" | head -8
  # the 16 dispatch blocks measured before (docs/results.md) against the new default of 32 at world 2
  t=$(( ($(left) - 80) / 2 )); [ "$t" -gt 40 ] && TANDEM_MOE_DISPATCH_BLOCKS=16 timeout -s INT -k 10 $t \
    python3 -m tandem.launch -n 2 -- python3 tools/diag/moe_layer_steps.py --out "$OUT/diag/b16" 2>&1 | \
    grep -E "^rank|Error" | head -8
  t=$(( $(left) - 80 )); [ "$t" -gt 40 ] && TANDEM_MOE_SWIGLU=torch TANDEM_MOE_DISPATCH_BLOCKS=8 TANDEM_MOE_WAIT_NS=0 \
    timeout -s INT -k 10 $t python3 -m tandem.launch -n 2 -- \
    python3 tools/diag/moe_layer_steps.py --out "$OUT/diag/old" 2>&1 | grep -E "^rank|Error" | head -8
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 5 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --layer --reps 5 \
    --tokens 1024,4096 --out "$OUT/diag" 2>&1 | tail -6
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = z1 ]; then
  # branch integ3 = main + ring-bwd-cudnn + fp8-cublaslt + moe-grad (none run before): ring attention's backward with
  # cuDNN's block kernel (gradient tests: both block kernels against fp32 autograd, which one ran), the FP8 TP ops
  # with cuBLASLt as the unfused GEMM (both GEMMs exact), moe_ffn's autograd (the dispatch-only mode; gradients
  # against fp32 autograd of the reference, worlds 1-4) and the bindings' CPU test (Mode DISPATCH needs the built
  # module); then bench attention -n 1 (backward against SDPA cuDNN),
  # bench tp -n 4 --fp8 (FP8 against bf16), bench moe -n 2 --layer (the heap fix), bench gemm bf16 (the op with
  # the rebuilt table), each in the time left
  # (with the prebuilt module there is no build: the tests get all but BENCH_S of the call, ~250-300 s of them)
  t=$(( $(left) - ${BENCH_S:-200} )); [ "$t" -lt 30 ] && { echo "z1: $t s left for the tests"; exit 1; }
  timeout -s INT -k 20 $t bash tools/device_suite.sh tests/gpu/test_tp.py \
    tests/gpu/test_ring_attention.py tests/gpu/test_moe.py tests/cpu/test_typed_bindings.py --durations=0 \
    -k "gradients or fp8 or ffn or typed"
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 140 )); [ "$t" -gt 50 ] && timeout -s INT -k 10 $t python3 -m tandem bench attention -n 1 \
    --seqs 8192,32768 --reps 5 --out "$OUT/diag" 2>&1 | tail -10
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 70 )); [ "$t" -gt 50 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n 4 --reps 5 --fp8 \
    --shapes 16384x8192x4096,8192x4096x8192 --out "$OUT/diag" 2>&1 | tail -8
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 5 )); [ "$t" -gt 50 ] && timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --layer --reps 5 \
    --tokens 1024,4096 --out "$OUT/diag" 2>&1 | tail -8
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = k1 ]; then
  # branch integ2 = main + fp8-configs + ring-bwd + moe-ffn + rs-stream-loads (none run before; they merge
  # cleanly; the CPU suite passed on the four merged, 256): their tests in one build (pipelined: ring-bwd moved its peer_bases into
  # _runtime), then the benches of h1 and r1 in the time left
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-300} )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    tests/gpu/test_tp.py tests/gpu/test_ring_attention.py tests/gpu/test_tp_train.py tests/gpu/test_moe.py \
    -k "scaled or fp8 or gradients or backward or matches_sdpa or train or ffn or pipelined or streaming"
  timeout 60 python3 tools/diag/grouped_mm_probe.py 2>&1 | tail -14  # moe_ffn's GEMM 2 (torch._grouped_mm) alone
  timeout 90 python3 tools/diag/gemm_host_path.py 2>&1 | tail -8  # the GEMM op's host path (issue 23)
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 200 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --out "$OUT/diag" 2>&1 | tail -5
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 100 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench attention -n 1 \
    --seqs 8192,32768 --reps 5 --out "$OUT/diag" 2>&1 | tail -12
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 5 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n 4 --reps 5 --fp8 \
    --shapes 16384x8192x4096,8192x4096x8192 --out "$OUT/diag" 2>&1 | tail -10
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = h1 ]; then
  # branch fp8-configs (not run before): the FP8 GEMM's six configurations (test_gemm), then bench gemm with every
  # configuration of both dtypes (the FP8 table's data: python -m tandem tune gemm --from-bench), then bench tp with
  # the FP8 ops beside bf16 at world 4 (issue 23: FP8 TP ops faster than bf16)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-330} )) bash tools/device_suite.sh tests/gpu/test_gemm.py \
    tests/gpu/test_tp.py -k "scaled or fp8"
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 150 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench gemm --reps 10 \
    --out "$OUT/diag" 2>&1 | tail -5
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 5 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n 4 --reps 5 --fp8 \
    --out "$OUT/diag" 2>&1 | tail -24
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = r1 ]; then
  # branch ring-bwd (not run before): ring attention's autograd, the unfused backward (test_ring_attention's
  # gradient cases, worlds 1-4, and the emulated-nodes refusal), then bench attention at world 1 (forward and
  # backward against SDPA cuDNN and flash) and at world 2 (forward against the torch ring)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-240} )) bash tools/device_suite.sh tests/gpu/test_ring_attention.py \
    -k "gradients or backward or matches_sdpa"
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 100 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench attention -n 1 \
    --seqs 8192,32768 --reps 5 --out "$OUT/diag" 2>&1 | tail -12
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 5 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench attention -n 2 \
    --seqs 8192,32768 --reps 5 --out "$OUT/diag" 2>&1 | tail -8
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = m1 ]; then
  # branch moe-ffn (not run before): torch.ops.tandem.moe_ffn, the unfused chain (issue 26)
  timeout -s INT -k 20 $(( $(left) - ${BENCH_S:-200} )) bash tools/device_suite.sh tests/gpu/test_moe.py -k "ffn"
  timeout 60 python3 tools/diag/grouped_mm_probe.py 2>&1 | tail -14  # (built above) torch._grouped_mm's behaviour
  mkdir -p "$OUT/diag"
  t=$(( $(left) - 5 )); [ "$t" -gt 60 ] && timeout -s INT -k 10 $t python3 -m tandem bench moe -n 2 --layer \
    --reps 5 --out "$OUT/diag" 2>&1 | tail -10
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = f2 ]; then
  # the rest of the suite on integ: test_tp's cases f1 left out, and the files the last session did not reach
  timeout -s INT -k 20 $(( $(left) - 10 )) bash tools/device_suite.sh tests/gpu/test_tp.py tests/gpu/test_transport.py \
    tests/gpu/test_consumer.py tests/gpu/test_torchrun.py --durations=0 \
    -k "not (swizzle or in_pieces or fp8_ag or tile_claims or test_ag_gemm_and_gemm_rs_match_torch or gathered_view)"
elif [ "$part" = e4 ]; then
  # branch rs-swizzle (not run before): the pieces with a swizzle (test_tp's pieces cases, the new swizzle test),
  # then the world-4 trace: is the fused GEMM+RS's GEMM role (1.5x the core beside the reductions) held back by B
  # re-read from HBM per cluster row? The core with swizzle 2/4/8 (--controls) and the fused kernel with
  # TANDEM_TP_SWIZZLE=2/4 (pieces of whole groups), then bench tp at world 4 with the better swizzle if any
  timeout -s INT -k 20 $(( $(left) - ${TRACE_S:-300} )) bash tools/device_suite.sh tests/gpu/test_tp.py \
    -k "swizzle or in_pieces or tile_claims_match or emulated"
  mkdir -p "$OUT/diag"
  t=$(( $(left) - ${BENCH_S:-150} )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem.launch -n 4 -- \
    python3 tools/diag/tp_trace.py --shapes 16384x8192x4096,8192x8192x28672 --ops gemm_rs,gemm_ar --comm-blocks 6,4 \
    --sm-counts 28 --reps 3 --controls --variants "base;TANDEM_TP_SWIZZLE=2;TANDEM_TP_SWIZZLE=4;TANDEM_TP_SWIZZLE=8" \
    --out "$OUT/diag/swizzle_w4" > "$OUT/diag/swizzle_w4.log" 2>&1
  grep -E "^(gemm|ag)|GEMM steps done|reduce pieces" "$OUT/diag/swizzle_w4.log" | cut -c1-300
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
  t=$(( $(left) - 5 )); [ "$t" -gt 60 ] && TANDEM_TP_SWIZZLE=${SWZ:-4} timeout -s INT -k 10 $t python3 -m tandem bench tp \
    -n 4 --reps 5 --out "$OUT/diag" 2>&1 | tail -24
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
elif [ "$part" = d2 ]; then
  # bench tp at worlds 4 and 2 (the issue-21 table: fused with claims and pieces), then the comm_blocks sweep
  bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares > /dev/null 2>&1  # build
  mkdir -p "$OUT/diag"
  bench_tp_worlds 240 60
  t=$(( $(left) - 10 )); [ "$t" -gt 40 ] && timeout -s INT -k 10 $t python3 -m tandem bench tp -n 4 --reps 3 --sweep \
    --shapes 16384x8192x4096 --out "$OUT/diag/sweep" 2>&1 | tail -6
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
else
  echo "unknown part '$part' (n1, n2, n3, f, t1, g, t, t4, m, c1, c2, c3, c4, d0, d1, d2, d3, d4, d5, e1, e2, e3, e4)"; exit 2
fi
