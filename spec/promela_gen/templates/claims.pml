/* ==================================================================================== CLAIMS
 * Configuration `claims` (generated from spec/table.toml, spec/claim.toml, spec/approval.toml).${ablation_note}
 * ${intents} approval-gated intents share one target: its claim row (${claim_states}; epoch,
 * owner token, bound intent and approval, lease) and its version; up to ${approvals} approvals
 * (${approval_states}), each drafted against the target version current when it was given;
 * (approval a is for intent ((a - 1) mod ${intents}) + 1); ${workers} workers that reserve, replace and release the claim with possibly stale claim leases and crash
 * at any step; the sweeper, the reconciler, one operator move, one draft edit after review, the
 * database clock (intent leases, claim leases, approval deadlines). Intent events move the claim
 * as their `couples` field says, in the same atomic step. The intent machine's own guards are
 * abstracted (CLAIMS_INTENT_GUARDS in spec/promela.py): attempt ownership and leases stay, the
 * rest is checked by the other configurations.
 *
 * Properties:
${property_doc}
 */

#ifndef CHECK
#define CHECK 0
#endif
${property_switches}

#define NOBODY ${workers}
#define NI ${intents}
#define NA ${approvals}
#ifndef NT
#define NT ${attempts}
#endif
#ifndef NC
#define NC ${claim_takes}
#endif
#ifndef CLAIMS_OPERATOR_MOVES
#define CLAIMS_OPERATOR_MOVES 1
#endif
#define NONE 0
#define LIVE 1
#define EXPIRED 2
#define SEND_NONE 0
#define SEND_OK 1
#define SEND_NOT_SENT 2
#define SEND_UNKNOWN 3
#define FOUND 1
#define NOT_FOUND 2

mtype:state = { ${states} };
mtype:claim = { ${claim_states} };
mtype:approval = { ${approval_states} };

/* ---- the intents (index 1..NI): state, attempt token, send lease, digest of the current draft */
mtype:state i_st[NI + 1];
byte i_tok[NI + 1];
byte i_dig[NI + 1];
bit i_gap[NI + 1];          /* ghost: bytes of this intent between its authorization and its send */
byte tok_seq;
/* ---- the target's claim row */
mtype:claim c_st;
byte c_ep, c_tok, c_key, c_apv, c_lease, tver, ctok_seq;
bit c_tied;                 /* the claim lease is the bound intent's send lease (extend_claim_lease) */
/* ---- the approvals (index 1..NA) */
mtype:approval a_st[NA + 1];
byte a_key[NA + 1], a_ver[NA + 1], a_dig[NA + 1], a_dl[NA + 1];
bit a_named[NA + 1];        /* ghost: a named person gave it */
bit a_used[NA + 1];         /* ghost (P12): it authorized a dispatch */
byte na;
byte g_vers;                /* ghost (P13): target versions the dispatched approvals were drafted against */
byte g_ctok[${workers}];             /* ghost (P15): the claim owner token each worker holds (0: none; forgotten on a crash) */
bit restore_unfenced;       /* no restore in this configuration (CLAIMS_EVIDENCE) */

mtype:state t_from;
mtype:claim t_cfrom;
mtype:approval t_afrom;
byte t_clease, t_ctok;
bit t_app;

inline cworker_reset() {
  wk = 0; my_gen = 0; cl_ep = 0; cl_tok = 0; g_ctok[w] = 0; out = SEND_NONE; authed = 0
}

${events}

/* A dispatch worker: works on one intent at a time (chosen freely), reserves or replaces the
 * claim with any approval, calls the intent's worker events with the leases it holds (possibly
 * stale), sends once after an authorization, and may crash at any step (it forgets everything). */
proctype cworker(byte w) {
  byte wk, k, ap, my_gen, cl_ep, cl_tok, out;
  bit authed, ok;
end:
  do
  :: atomic { wk == 0 -> if :: w == 0 -> k = 1 :: else -> ${pick_k} fi; wk = k }   /* worker 0 works on intent 1 */
${worker_alts}
  :: atomic { authed && k == wk ->
       assert(!P10_one_dispatch_per_target || (i_st[k] == ${in_flight} && c_st == ${claim_dispatching} && c_key == k
              && c_ep == cl_ep && c_tok == cl_tok && ${others_idle}));
       authed = 0; i_gap[k] = 0;
       if
       :: out = SEND_OK; printf("MSC: worker %d: intent %d's bytes leave: success\n", w, k)
       :: out = SEND_NOT_SENT; printf("MSC: worker %d: intent %d: not sent\n", w, k)
       :: out = SEND_UNKNOWN; printf("MSC: worker %d: intent %d's bytes leave: unknown\n", w, k)
       fi }
  :: atomic { wk != 0 -> if :: authed -> i_gap[wk] = 0 :: else -> skip fi; cworker_reset(); k = 0 }   /* crash */
  od
}

proctype csweeper() {
  byte k, ap;
  bit ok;
end:
  do
${sweeper_alts}
  od
}

proctype creconciler() {
  byte k, ap;
  bit ok;
end:
  do
${reconciler_alts}
  od
}

proctype coperator() {
  byte k, ap, moves;
  bit op_named, ok;
end:
  do
${operator_alts}
  od
}

/* The approver: up to NA approvals, each of one intent's current draft, named or not. */
proctype capprover() {
  byte k, ap;
  bit op_named, ok;
end:
  do
${approver_alts}
  od
}

/* The editor changes one queued draft once, after it may have been approved (new bytes). */
proctype ceditor() {
end:
  atomic { if ${edits} fi }
}

/* The database clock: deadlines pass at any moment, except that bytes leave before the send
 * lease ends (and with it the claim lease it was extended to). */
proctype cclock() {
end:
  do
  :: d_step { c_lease == LIVE && !(c_tied && i_gap[c_key]) -> c_lease = EXPIRED;
       printf("MSC: clock: the claim lease passes\n") }
${approval_clock}
  od
}

init {
  atomic {
    ${init_intents};
    c_st = ${claim_initial};
    ${run_workers}; run csweeper(); run creconciler(); run coperator();
    run capprover(); run ceditor(); run cclock()
  }
}
