# Shared helpers for the TCP backend's tests: start N ranks of zrun with torchrun's variables set by
# hand (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each under a
# timeout, on a random free port; one OpenMP thread each (the CI has 2 cores).
Z=${ZRUN_BIN:-./zrun}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export ZRUN_COMM_TIMEOUT=${ZRUN_COMM_TIMEOUT:-60} # bounds the rendezvous too
# a port nobody listens on: random (parallel runs do not collide), below Linux's ephemeral range
# (32768-60999), where outgoing connections take theirs
free_port() {
  while :; do
    p=$(( $(od -An -N2 -tu2 /dev/urandom) % 12000 + 20000 ))
    if command -v ss >/dev/null 2>&1 && [ -n "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then continue; fi
    echo $p; return
  done
}
# tcp_launch N DIR CMD...: ranks 0..N-1, output of rank r in DIR/r.log; returns the first nonzero
# exit status (124: a rank ran past the 120 s timeout). A port taken meanwhile: once more on another.
tcp_launch() {
  tcp_launch_on "$(free_port)" "$@"; rc=$?
  if [ $rc -ne 0 ] && grep -q "is in use on rank 0.s host" "$2/0.log"; then tcp_launch_on "$(free_port)" "$@"; rc=$?; fi
  return $rc
}
tcp_launch_on() {
  port=$1 n=$2 dir=$3; shift 3
  pids="" i=0
  while [ $i -lt $n ]; do
    RANK=$i WORLD_SIZE=$n LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout ${TCP_TIMEOUT:-120} "$@" >"$dir/$i.log" 2>&1 &
    pids="$pids $!"; i=$((i + 1))
  done
  rc=0
  for p in $pids; do wait $p; r=$?; [ $rc -eq 0 ] && rc=$r; done
  return $rc
}
