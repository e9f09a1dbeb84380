#!/usr/bin/env bash
# Diagnostic for C++ exceptions in extension modules on a machine: a bare pybind11 module, then tandem._C
# with the static and the shared CUDA runtime, each with and without torch imported first.
set -u
OUT=${OUT:-/tmp}
cd "$(dirname "$0")"
python3 -c "import sys, pybind11; print(sys.executable, sys.version); print('pybind11', pybind11.__version__)"
env | grep -E "^(LD_|PYTHON|CUDA_MPS)" || true
py=$(python3 -c "import sys, os; print(os.path.realpath(sys.executable))")
echo "interpreter: $py"; ldd "$py" | grep -E "gcc_s|stdc|python" | tr -s ' '
nm -D --defined-only "$py" 2>/dev/null | grep -E " _Unwind_RaiseException$| __cxa_throw$" && echo "the interpreter itself exports an unwinder"
c++ --version | head -1
ext=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
c++ -O2 -shared -fPIC $(python3 -m pybind11 --includes) throw_probe.cc -o /tmp/throw_probe$ext && \
for pre in "" "import torch;"; do
  python3 -X faulthandler -c "import sys; sys.path.insert(0, '/tmp'); ${pre}import throw_probe as t; print('caught in C++:', t.throw_caught())
try:
    t.throw_runtime()
except RuntimeError as e: print('bare pybind11 throw ok [$pre]', e)" 2>&1 | tail -2
done
cd ../..
working=""
for static in ON OFF CXX; do
  defs="-Ccmake.define.TANDEM_CUDART_STATIC=$static"
  [ $static = CXX ] && defs="-Ccmake.define.TANDEM_CUDART_STATIC=ON -Ccmake.define.TANDEM_STATIC_CXX_RUNTIME=ON"
  python3 -m pip install -q --no-build-isolation --no-deps -e . $defs > $OUT/build_$static.log 2>&1 || tail -5 $OUT/build_$static.log
  so=$(python3 -c "import tandem._C as c; print(c.__file__)")
  echo "cudart static=$static: $(ldd $so | grep -E 'cudart|stdc|gcc_s' | tr -s ' ' | tr '\n' ';')"
  for pre in "" "import torch;"; do
    python3 -X faulthandler -c "${pre}import tandem._native as n
try:
    n.native()._raise_error_for_test(1, 'selftest', 0, 1)
except Exception as e: print('tandem throw ok [static=$static $pre]', type(e).__name__)" > /tmp/throw.log 2>&1
    echo "exit $?: $(grep -E 'ok|Fatal|Segmentation' /tmp/throw.log | head -2 | tr '\n' ' ')"
    grep -q "tandem throw ok" /tmp/throw.log && [ -n "$pre" ] && [ -z "$working" ] && working="$defs"
  done
  [ -n "$working" ] && break
done
echo "use: ${working:-none}"

readelf -lW $so | grep -i eh_frame
# Who provides the unwinder and __cxa_throw once torch is loaded?
LD_DEBUG=bindings python3 -c "import torch, tandem._C" 2>&1 | grep -E "tandem.*(_Unwind_RaiseException|__cxa_throw)" | head -4
for lib in $(python3 -c "import torch, os; d=os.path.join(os.path.dirname(torch.__file__), 'lib'); print(' '.join(os.path.join(d, f) for f in os.listdir(d) if f.endswith('.so')))"); do
  n=$(nm -D --defined-only $lib 2>/dev/null | grep -cE " (__cxa_throw|_Unwind_RaiseException)$")
  [ "$n" != 0 ] && echo "exports the C++ runtime: $lib"
done
