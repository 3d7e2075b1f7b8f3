"""The decoding policy, pure and synchronous: what token comes next and when a reply stops, given a
row of logits. Sampling (greedy, seeded top-k/top-p by partial selection, log-probabilities), the
penalties and `logit_bias` applied before it, stop strings matched across token boundaries, and exact
speculative decoding's two halves: prompt-lookup drafts and the per-request draft-length policy. No
trio and no kernel here; the decode and prefill workers call in, and the kernel verifies drafts."""
