# Stand-in for QAIRT's bin/envsetup.sh (tests only): `source` it; sets what the real one sets for these tools.
# QNN_SDK_ROOT is the folder above bin/ (qairt/<version>), as with the real script.
_qairt_bin="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
export QNN_SDK_ROOT="$(cd "$_qairt_bin/.." && pwd)"
export SNPE_ROOT="$QNN_SDK_ROOT"
export PYTHONPATH="$QNN_SDK_ROOT/lib/python${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$QNN_SDK_ROOT/bin/x86_64-linux-clang${PATH:+:$PATH}"
export LD_LIBRARY_PATH="$QNN_SDK_ROOT/lib/x86_64-linux-clang${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _qairt_bin
echo "[INFO] QNN_SDK_ROOT: $QNN_SDK_ROOT"
