/* Another intent of the same account with the same normalized text, run by the same protocol:
 * it claims the text slot at its authorization if this intent does not hold it; then it lands. */
proctype other_intent() {
end_claim:
  atomic { txt_ours == 0 && txt_other == 0 -> txt_other = 1; printf("MSC: other intent: claims the text slot\n") };
end_land:
  atomic { txt_other == 1 -> txt_other = 2; printf("MSC: other intent: its effect lands\n"); assert(!P9_duplicate_text_excluded || !ours_landed) }
end_done:
  skip
}
