#ifndef CHECK
#define CHECK 0
#endif
/* property switches: constants (their names appear in a failed assertion's text) */
${property_switches}

#define NOBODY ${workers}
#define MAX_ATTEMPTS ${max_attempts}
#define MAX_RECONCILES ${max_reconciles}
#ifndef OPERATOR_MOVES
#define OPERATOR_MOVES ${operator_moves}
#endif
#if OPERATOR_MOVES > ${operator_moves}
#error "OPERATOR_MOVES may not exceed ${operator_moves}: regenerate with larger bounds"
#endif
#define SLOTS (MAX_ATTEMPTS + OPERATOR_MOVES)
#define ANY_IN_GAP (${any_in_gap})
#ifdef CUT_AT_BOUND
#define SEND_ROOM (nreq < SLOTS)   /* ablations: a send beyond the slots is not explored */
#else
#define SEND_ROOM 1                /* the model proper: running out of slots is an error */
#endif

/* lease_expires_at: none, ahead of the store clock, passed */
#define NONE 0
#define LIVE 1
#define EXPIRED 2
/* a request on the platform */
#define TRANSIT 1
#define LANDED 2
#define DEAD 3
/* what the transport told a worker */
#define SEND_NONE 0
#define SEND_OK 1
#define SEND_NOT_SENT 2
#define SEND_UNKNOWN 3
/* what a reconciler lookup found */
#define FOUND 1
#define NOT_FOUND 2
/* what the authorizing write meets: all current, or one thing off */
#define POL_OK 0
${policy_defines}

mtype:state = { ${states} };

/* ---- the intent row and its ghost companions (a restore rewinds all of these) */
${row_decls}

/* ---- the world */
byte repoch;               /* the database's restore epoch (durable: a restore advances it) */
byte tok_seq;              /* ghost: attempt tokens ever issued (tokens are random: never rewound) */
bit restored;              /* a restore happened */
bit restore_unfenced;      /* a restore happened and the operator has not declared the fence yet */
byte txt_other;            /* the other intent: 0 nothing, 1 holds the text slot, 2 its effect landed */

/* ---- the platform: one slot per send */
byte req_st[${slot_array}];    /* 0 unsent / TRANSIT (in the network) / LANDED / DEAD */
byte req_ep[${slot_array}];    /* the resend epoch the request carried */
byte req_fe[${slot_array}];    /* the fence epoch the request carried */
bit tomb[${tombs}];      /* the platform's tombstones, by key (resend epoch, fence epoch) */
#define KEY(ep, fe) ((ep) * ${slot_array} + (fe))
#define TOMBED(i) (tomb[KEY(req_ep[i], req_fe[i])])
bit req_ex[${slot_array}];     /* excused by an identified operator's move (P1, P8) */
byte nreq;
bit FENCED;                /* the platform's lookup by key is fenced */

/* ---- ghost state for the properties */
bit wl[NOBODY + 1];        /* the worker believes it holds a live lease (P6); slot NOBODY unused */
bit ingap[NOBODY + 1];     /* between its authorizing write and its send: bytes leave before the deadline */
bit grant_live[NOBODY + 1];  /* its authorizing write was made under a live lease (P2) */
byte g_unexcused;          /* landed requests not excused by an operator (P1) */
bit ours_landed;           /* a request of this intent landed, not excused by an operator (P9) */
bit tainted, proof;        /* P3: been unknown since; a fenced lookup proved absence since */

/* scratch inside d_steps, reset to 0 before each d_step ends (not `hidden`: -DBFS refuses hidden variables) */
mtype:state t_from;
byte t_lease, t_i;

inline excuse_all() {
  for (t_i : 1 .. ${slots}) { req_ex[t_i] = 1 }; t_i = 0;
  g_unexcused = 0; ours_landed = 0; tainted = 0; proof = 0
}

inline land(i) {
  printf("MSC: platform: request %d lands\n", i);
  req_st[i] = LANDED;
  if :: !req_ex[i] -> g_unexcused++; ours_landed = 1 :: else -> skip fi;
  assert(!P1_at_most_one_effect || g_unexcused <= 1);
  assert(!P9_duplicate_text_excluded || req_ex[i] || txt_other != 2)
}

inline worker_reset() {
  my_gen = 0; my_tok = 0; my_rep = 0; my_ep = 0; my_fe = 0; my_rid = 0; pol = POL_OK; authed = 0; out = SEND_NONE;
  ingap[w] = 0; grant_live[w] = 0
}

inline sweeper_reset() {
  sw_have = 0; sw_state = 0; sw_gen = 0; sw_tok = 0; sw_rep = 0
}

inline plan_reset() {
  pl_have = 0; pl_gen = 0; pl_rc = 0; pl_rep = 0; pl_rid = 0; pl_ep = 0; pl_fe = 0; r_ev = 0; r_rid = 0
}

/* ================================================================ events (one per table row) */

${events}

/* ================================================================ the transport (not a table event)
 * One send per authorization; the request takes a slot on the platform. The transport reports
 * success (the object landed), a definitive not-sent (nothing reached the platform), or unknown
 * (the request is in transit: it may land later, or never). */
inline transport_send() {
  assert(!P2_send_needs_current_authorization ||
         (state == ${in_flight} && att_open && row_tok == my_tok && my_tok == tok_seq && gen == my_gen
          && lease == LIVE && grant_live[w] && pol == POL_OK));
  if
  :: nreq < SLOTS -> nreq++
  :: else -> assert(BOUND_request_slots_too_small)
  fi;
  req_ep[nreq] = my_ep; req_fe[nreq] = my_fe; req_ex[nreq] = 0;
  authed = 0; ingap[w] = 0;
  if
  :: !TOMBED(nreq) -> out = SEND_OK; my_rid = nreq; printf("MSC: worker %d: send request %d: success\n", w, nreq); land(nreq)
  :: out = SEND_NOT_SENT; req_st[nreq] = DEAD; printf("MSC: worker %d: send request %d: not sent\n", w, nreq)
  :: out = SEND_UNKNOWN; req_st[nreq] = TRANSIT; printf("MSC: worker %d: send request %d: unknown\n", w, nreq)
  fi
}
byte BOUND_request_slots_too_small = 0;

/* ================================================================ actors */

/* A dispatch worker: calls its table events in any order its evidence allows, with the lease it
 * holds (possibly stale), and may stop at every step boundary; it comes back with no memory. */
proctype worker(byte w) {
  byte my_gen, my_tok, my_rep, my_ep, my_fe, my_rid, out, pol;
  bit authed, ok;
end:
  do
${worker_alts}
  :: atomic { authed && SEND_ROOM -> transport_send() }
  :: atomic { (my_gen != 0 || out != SEND_NONE) -> worker_reset() }   /* crash */
  od
}

/* The sweeper: reads any open attempt it believes has expired (its listing may be stale or its
 * judgement early: the store's clock decides), then calls its event for the state it read. */
proctype sweeper() {
  mtype:state sw_state;
  byte sw_gen, sw_tok, sw_rep;
  bit sw_have, ok;
end:
  do
  :: atomic { !sw_have && att_open -> sw_have = 1; sw_state = state; sw_gen = gen; sw_tok = row_tok; sw_rep = row_rep }
${sweeper_alts}
  :: atomic { sw_have -> sweeper_reset() }   /* gives up or crashes */
  od
}

/* The reconciler: plans on an unknown-outcome intent (generation, reconcile count, remote id,
 * resend epoch), makes at most one lookup, then records what it found; its plan may be stale by
 * then. It claims `fenced` whenever the platform's lookup is fenced, whichever lookup it made. */
proctype reconciler() {
  byte pl_gen, pl_rc, pl_rep, pl_rid, pl_ep, pl_fe, r_ev, r_rid;
  bit pl_have, ok;
end:
  do
  :: atomic { !pl_have && state == ${unknown} -> pl_have = 1; pl_gen = gen; pl_rc = rc; pl_rep = repoch; pl_rid = rid; pl_ep = epoch; pl_fe = fepoch }
  /* read back by remote id: never fenced; a landed object may not be visible yet */
  :: atomic { pl_have && r_ev == 0 && pl_rid != 0 ->
       if
       :: req_st[pl_rid] == LANDED -> r_ev = FOUND; r_rid = pl_rid; printf("MSC: reconciler: read back: found\n")
       :: r_ev = NOT_FOUND; printf("MSC: reconciler: read back: not found\n")
       fi }
  /* lookup by the platform key: delivery key, resend epoch, fence epoch */
  :: atomic { pl_have && r_ev == 0 ->
${find_landed}
       if
       :: FENCED && r_rid != 0 -> r_ev = FOUND; printf("MSC: reconciler: fenced lookup: found\n")
       :: FENCED && r_rid == 0 ->
            r_ev = NOT_FOUND;   /* a fence: no request with this key can land any more */
            printf("MSC: reconciler: fenced lookup: not found\n");
#ifndef NO_TOMBSTONE
            tomb[KEY(pl_ep, pl_fe)] = 1;   /* the tombstone: no create with this key lands any more */
#endif
            if :: tainted && pl_ep == epoch && pl_fe == fepoch -> proof = 1 :: else -> skip fi
       :: !FENCED && r_rid != 0 -> r_ev = FOUND; printf("MSC: reconciler: lookup: found\n")
       :: !FENCED -> r_ev = NOT_FOUND; r_rid = 0;   /* unfenced: read lag may hide an object */
            printf("MSC: reconciler: lookup: not found\n")
       fi }
${reconciler_alts}
  :: atomic { pl_have -> plan_reset() }   /* gives up or crashes */
  od
}

/* An operator: at most OPERATOR_MOVES moves that the store accepts; a call may name no person. */
proctype operator() {
  byte moves;
  bit op_named, ok;
end:
  do
${operator_alts}
  od
}

/* The store clock: a lease deadline passes at any moment, except that a worker's bytes leave
 * before its send lease ends (the send lease outlasts the pause between authorizing and sending). */
proctype clock() {
end:
  do
  :: d_step { lease == LIVE && !ingap[holder] -> lease = EXPIRED; wl[holder] = 0; printf("MSC: clock: the lease passes its deadline\n") }
${orphans}
  od
}

/* The platform: a request in transit may land at any moment (or never). */
proctype platform() {
end:
  do
${landing}
  od
}

#ifdef OTHER_INTENT
${other_intent}#endif

#ifdef RESTORES
${restore}#endif

init {
  atomic {
    /* ${creator} (${creator_actor}): effects ${creator_effects} */
    ${create};
    holder = NOBODY;
    if :: FENCED = 1 :: FENCED = 0 fi;
    ${run_workers}; run sweeper(); run reconciler(); run operator(); run clock(); run platform();
#ifdef OTHER_INTENT
    run other_intent();
#endif
#ifdef RESTORES
    run dba();
#endif
    skip
  }
}
