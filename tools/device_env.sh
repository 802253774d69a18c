# Source this on a bare GPU machine that cannot reach PyPI (the course's own GPU runs):
#   . tools/device_env.sh
# Installs the wheels carried in .whl/ for the modules that are missing, then puts the
# checkout and those wheels on PYTHONPATH. The machine's own numpy/numba/cupy/torch stay.
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site
missing=""
for pair in pytest:pytest pluggy:pluggy iniconfig:iniconfig pytest_timeout:pytest_timeout \
            scipy:scipy tqdm:tqdm nbformat:nbformat nbclient:nbclient ipykernel:ipykernel \
            matplotlib:matplotlib ipywidgets:ipywidgets; do
  mod=${pair%%:*}; dist=${pair##*:}
  python3 -c "import $mod" 2>/dev/null || missing="$missing $dist"
done
if [ -n "$missing" ] && [ -d .whl ]; then
  # all carried wheels (--no-deps: a missing module's own dependencies are carried too)
  echo "device_env: missing:$missing; installing the carried wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
