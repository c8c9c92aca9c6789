"""Guard points on this host: the control plane of the compiled data plane (agents/dataplane/fuse).

`dataplane` starts one `strongroom-fuse` daemon per guard point and speaks its control
protocol (keys, policy, events); `manager` runs the guard points the key server assigns,
one supervising process each (`serve`: initial protection, live policy, rotation,
re-key; `raw`: mode off and unprotect), restarted after a crash; `adoption` takes a
directory in and gives it back; `records` the state files; `policy` is the access-rule
model; `protect` the initial protection and unprotect of files in place."""
