"""N-gram lookup drafting: guess the next tokens by copying what followed the text's last n tokens earlier.

This is prompt-lookup decoding (transformers' `prompt_lookup_num_tokens`) as a draft source for the
verified mode: it needs no model and no training, and it wins exactly where MARS's mask drafts are weak,
on text that repeats its input (rewrites, translations that keep names, code that reuses identifiers).

    lookup_drafts(tokens, max_ngram, max_drafts) -> Lookup(drafts, ngram, expected)

The search runs over the prompt and the text generated so far, longest n-gram first; among the earlier
occurrences of that n-gram it takes the most recent one (a list or a loop repeats its latest pattern).
A longer match predicts the copy better: it copies more tokens, and its `expected` accepted count is
higher; the verified mode's "both" rule (mars.decoding.modes.prefer_lookup) weighs that against the mask drafts.

Measured with scripts/measure_drafts.py (since removed; shipped adapter, 40 held-out prompts outside the bench's sample,
48 new tokens, 1002 verified passes): share of passes whose k-th copied token is accepted, k = 1..6,
  n=1 (267 passes): .16 .09 .06 .04 .03 .02
  n=2  (52 passes): .54 .31 .23 .14 .06 .04
  n=3  (63 passes): .60 .43 .25 .21 .16 .11
A copied token costs a forward input whether it is accepted or not (about 4-7% of a pass each on this
CPU, README "Cost of a forward pass"), so a match of n tokens copies 2n: beyond that the next copy is
accepted in fewer than ~1 pass in 10.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_NGRAM = 3  # longest suffix searched for: 3-token matches are already right 60% of the time
COPY_PER_MATCHED = 2  # a match of n tokens copies up to 2n (see above)
# mean accepted copies per pass by match length, with 2n copies (the sums of the shares above)
EXPECTED_ACCEPTED = {1: 0.25, 2: 1.21, 3: 1.76}
# the shares themselves: the chance that copy k is accepted, by match length (tree drafts weigh copies by it)
ACCEPTED_SHARE = {1: (.16, .09, .06, .04, .03, .02), 2: (.54, .31, .23, .14, .06, .04),
                  3: (.60, .43, .25, .21, .16, .11)}


@dataclass
class Lookup:
    drafts: list[int] = field(default_factory=list)  # the copied continuation, possibly empty
    ngram: int = 0  # length of the matched suffix (0: no match)

    @property
    def expected(self) -> float:
        """Mean accepted copies at this match length, as measured (0 without drafts)."""
        return EXPECTED_ACCEPTED.get(self.ngram, EXPECTED_ACCEPTED[MAX_NGRAM]) if self.drafts else 0.0


def lookup_drafts(tokens: list[int], max_ngram: int = MAX_NGRAM, max_drafts: int | None = None,
                  min_ngram: int = 1, per_matched: int = COPY_PER_MATCHED) -> Lookup:
    """The continuation (up to per_matched * n tokens, and max_drafts) of the most recent earlier
    occurrence of the longest suffix of `tokens`, n tokens long, that occurred before (n from max_ngram
    down to min_ngram)."""
    L = len(tokens)
    if max_drafts is not None and max_drafts < 1:
        return Lookup()
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        tail = tokens[L - n:]
        first = tail[0]
        # occurrences that end before the suffix itself starts overlapping the end: s + n <= L - 1,
        # so at least one token follows the match
        for s in range(L - n - 1, -1, -1):
            if tokens[s] == first and tokens[s:s + n] == tail:
                k = per_matched * n if max_drafts is None else min(per_matched * n, max_drafts)
                return Lookup(tokens[s + n:s + n + k], n)
    return Lookup()
