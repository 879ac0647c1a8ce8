/* The database: one backup at any moment, then one restore from it at any later moment. The
 * restore rewinds the row, its sequence and its text claims; the restore epoch (kept outside the
 * database) advances; every lease is void. Until the operator declares the restore fence, no worker
 * starts a new attempt; stragglers that were running before the restore may still act. */
proctype dba() {
  ${backup_decls}
  atomic { ${take_backup} printf("MSC: database: backup taken\n") };
end_restore:
  atomic {
#ifndef RESTORE_ANYTIME
    !ANY_IN_GAP ->   /* opened only once every send lease issued before the restore has run out */
#endif
    ${do_restore}
    ${clear_backup}
    repoch++; restored = 1; printf("MSC: database: restored from the backup\n");
    restore_unfenced = ${left_open};
    for (t_i : 0 .. NOBODY) { wl[t_i] = 0 }; t_i = 0;
    tainted = 0; proof = 0
  }
}
