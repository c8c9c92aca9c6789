"""Guard points on this host: the control plane of the compiled data plane (agents/dataplane/fuse).

`dataplane` starts one `strongroom-fuse` daemon per guard point and speaks its control
protocol (keys, policy, events); `manager` runs the guard points the key server assigns
(one supervising process each: initial protection, live policy, rotation, re-key,
unprotect); `policy` is the access-rule model; `protect` the initial protection and
unprotect of files in place."""
