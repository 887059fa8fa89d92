"""
The course: every assignment, the functions a student writes and the tests that grade them.

This list is the single source of truth. handout.py blanks the functions named here, grade.py runs
the tests named here, and tests/test_assignments.py checks both (a stub never passes, no assignment
needs a later one, no solution leaks into a handout) and the write-ups against them. The reference
source carries no markers, so keep this list up to date when a function or a test is renamed: a
name that no longer exists is an error in handout.py and in CI.

functions: "file:function" or "file:Class.method". The handout keeps the signature and the
           docstring (the specification) and replaces the rest of the body with
           raise NotImplementedError("assignment N: name").
tests:     pytest node ids, run from the repository root: a whole test function (all its
           parametrized cases) or one case ("...[gpt-tiny]"). Assignments 3 and 5 grade on the GPT
           cases only, because the Llama cases need assignment 6 (RoPE); assignment 6 grades the
           Llama cases.
points:    the assignment's total. Its questions' points are taken first; the rest is split
           equally over the listed tests, and a test with several parametrized cases earns its
           share in proportion to the cases it passes. Experiments (kind "experiment") are written
           up and graded by hand.
questions: QUESTIONS below, the graded questions of an implementation assignment (its
           write-up's "## Graded questions"): id "N.i", points, the answer's kind ("ints": a list
           of integers; "numbers:D": a list of numbers rounded to D decimals), a salt and the
           digest of the canonical answer (grade.py's digest(); the answers are not stored here).
           The student answers in answers.toml; answers_reference.toml (staff only) holds the
           reference's.
writeup:   the assignment's text. For an implementation assignment CI checks it against this list
           and the code: the title line's points, one ```python block under "## What to write"
           with every function's exact signature and a docstring of shapes, "N tests (M cases)" as
           the grader collects them, and "you write about N lines" as handout.py --measure counts
           them (README.md, "What CI checks in a write-up").
"""

ASSIGNMENTS = [
    dict(
        number=1, title="Attention masks", kind="implementation", points=10, builds_on=[],
        writeup="01_masks.md",
        functions=["model.py:causal_mask", "sbd.py:block_id", "sbd.py:hybrid_mask",
                   "sbd.py:sbd_training_mask"],
        tests=[
            "tests/test_model.py::test_causal_mask",
            "tests/test_model.py::test_hybrid_mask",
            "tests/test_model.py::test_sbd_training_mask_phase_0",
            "tests/test_model.py::test_sbd_training_mask_phase_1",
            "tests/test_training.py::test_training_mask_is_the_worked_example",
            ("tests/hidden/test_hidden_training.py::"
             "test_training_mask_follows_the_rules_per_row_phase"),
            "tests/test_assignment_1.py::test_block_id_floors_below_the_phase",
            "tests/test_assignment_1.py::test_masks_are_pure_functions_of_query_and_key",
        ]),
    dict(
        number=2, title="The SBD training objective", kind="implementation", points=10,
        builds_on=[1], writeup="02_objective.md",
        functions=["sbd.py:add_noise", "sbd.py:noisy_labels", "sbd.py:sbd_layout",
                   "sbd.py:sbd_loss"],
        tests=[
            "tests/test_training.py::test_labels_of_the_worked_example",
            "tests/test_training.py::test_labels_with_random_noise",
            "tests/test_training.py::test_masking_rate_is_drawn_per_sequence",
            ("tests/hidden/test_hidden_training.py::"
             "test_loss_is_one_cross_entropy_over_all_labelled_positions"),
            "tests/test_assignment_2.py::test_noise_follows_the_generator",
            "tests/test_assignment_2.py::test_all_masked_rows_shifts_rows_to_masked_whole",
            "tests/test_assignment_2.py::test_loss_reaches_only_labelled_positions",
            "tests/test_assignment_2.py::test_loss_of_known_probabilities",
        ]),
    dict(
        number=3, title="The exact KV cache with commit", kind="implementation", points=10,
        builds_on=[1], writeup="03_kv_cache.md",
        functions=["model.py:KVCache.extend"],
        tests=[
            "tests/test_assignment_3.py::test_extend_writes_only_the_committed_tokens",
            "tests/test_assignment_3.py::test_a_full_cache_is_a_clear_error_and_stays_unchanged",
            "tests/test_assignment_3.py::test_each_row_is_written_after_its_own_length",
            "tests/test_model.py::test_cached_decoding_equals_full_forward[1-gpt-tiny]",
            "tests/test_model.py::test_cached_decoding_equals_full_forward[3-gpt-tiny]",
            ("tests/test_model.py::"
             "test_block_on_cache_equals_full_forward_and_leaves_cache_alone[gpt-tiny]"),
            "tests/test_model.py::test_commit_previous_and_new_block_in_one_forward[gpt-tiny]",
            "tests/test_decoding.py::test_cached_ntp_equals_uncached[1-gpt-tiny]",
            "tests/test_decoding.py::test_cached_ntp_equals_uncached[3-gpt-tiny]",
        ]),
    dict(
        number=4, title="Reveal rules: EB-Sampler and the factor rule", kind="implementation",
        points=15, builds_on=[], writeup="04_reveal_rules.md",
        functions=["sampling.py:entropy", "sampling.py:entropy_bound", "sampling.py:reveal_entropy",
                   "sampling.py:reveal_confidence", "sampling.py:reveal_left",
                   "sampling.py:reveal_factor"],
        tests=[
            "tests/test_assignment_4.py::test_entropy_of_known_distributions",
            "tests/test_assignment_4.py::test_entropy_bound_by_hand",
            "tests/hidden/test_hidden_reveal_rules.py::test_rule_matches_by_hand",
            "tests/hidden/test_hidden_reveal_rules.py::test_thresholds_in_between_vary_the_count",
            "tests/test_samplers.py::test_gamma_zero_reveals_one_and_huge_gamma_all",
            "tests/test_samplers.py::test_factor_extremes",
            "tests/test_samplers.py::test_factor_rule_is_one_minus_confidence",
            "tests/test_samplers.py::test_ties_keep_lower_position_first",
            "tests/test_samplers.py::test_single_mask_and_no_mask",
            "tests/test_samplers.py::test_batch_rows_are_independent",
            "tests/hidden/test_hidden_reveal_rules.py::test_rules_take_float32",
            "tests/test_samplers.py::test_block_sampler_reveals_on_the_temperature_one_distribution",
            "tests/hidden/test_hidden_reveal_rules.py::test_left_rule_matches_by_hand",
            ("tests/test_assignment_4.py::"
             "test_left_rule_reveals_a_prefix_in_position_order"),
        ]),
    dict(
        number=5, title="Block decoding (Algorithms 2 and 3)", kind="implementation", points=20,
        builds_on=[1, 2, 3, 4], writeup="05_block_decoding.md",
        functions=["decode.py:hybrid_forward", "decode.py:fill", "decode.py:sbd"],
        tests=[
            "tests/test_training.py::test_training_forward_equals_decoding_forward[4-gpt-tiny]",
            "tests/test_training.py::test_training_forward_equals_decoding_forward[5-gpt-tiny]",
            "tests/test_assignment_5.py::test_blocks_of_one_are_next_token_decoding",
            ("tests/test_assignment_5.py::"
             "test_a_drafter_that_is_always_right_fills_a_block_per_forward"),
            ("tests/test_assignment_5.py::"
             "test_decoding_goes_on_from_a_committed_block_as_from_a_prompt_that_holds_it"),
            "tests/test_assignment_5.py::test_a_one_token_prompt_has_nothing_to_prefill",
            "tests/test_assignment_5.py::test_a_row_stops_without_waiting_for_the_rest_of_its_block",
            "tests/test_assignment_5.py::test_the_last_block_is_cut_to_max_new_tokens",
            "tests/test_assignment_5.py::test_the_mask_token_is_never_emitted",
            "tests/test_reference_decoding.py::test_plain_sbd_is_servings[False-gpt-tiny]",
            ("tests/test_reference_decoding.py::"
             "test_plain_sbd_sampled_and_without_the_ntp_term_is_servings[gpt-tiny]"),
            # hidden: against the uncached reference decoder
            "tests/hidden/test_hidden_assignment_5.py::test_sbd_equals_uncached",
            "tests/hidden/test_hidden_assignment_5.py::test_stop_token_ends_the_row_and_truncates",
            "tests/hidden/test_hidden_assignment_5.py::test_decoding_may_fill_the_whole_context",
            "tests/hidden/test_hidden_assignment_5.py::test_fill_fills_one_block_and_commits_nothing",
            "tests/hidden/test_hidden_assignment_5.py::test_one_token_prompt_has_no_prefill",
        ]),
    dict(
        number=6, title="Llama internals: RoPE, GQA, HF's q/k permutation", kind="implementation",
        points=15, builds_on=[1, 2, 3, 4, 5], writeup="06_llama.md",
        functions=["model.py:rope_frequencies", "model.py:apply_rotary",
                   "model.py:LlamaAttention.forward", "pretrained/load_llama.py:hf_permute",
                   "pretrained/load_llama.py:hf_unpermute"],
        tests=[
            "tests/test_assignment_6.py::test_llama31_scaling_keeps_divides_and_interpolates",
            "tests/test_assignment_6.py::test_rope_without_scaling",
            "tests/test_assignment_6.py::test_apply_rotary_turns_each_pair_by_its_angle",
            "tests/test_assignment_6.py::test_apply_rotary_per_row_positions_and_dtype",
            "tests/test_llama_io.py::test_hf_permute_by_hand",
            "tests/test_assignment_6.py::test_hf_unpermute_inverts_hf_permute",
            "tests/test_llama_io.py::test_hf_permute_turns_meta_rotary_into_rotate_half",
            "tests/test_llama_io.py::test_meta_layout_loads_exactly",
            "tests/test_llama_io.py::test_hf_sharded_layout_loads_exactly",
            "tests/test_model.py::test_cached_decoding_equals_full_forward[1-llama-tiny]",
            "tests/test_model.py::test_cached_decoding_equals_full_forward[3-llama-tiny]",
            ("tests/test_model.py::"
             "test_block_on_cache_equals_full_forward_and_leaves_cache_alone[llama-tiny]"),
            "tests/test_model.py::test_commit_previous_and_new_block_in_one_forward[llama-tiny]",
            "tests/test_training.py::test_training_forward_equals_decoding_forward[4-llama-tiny]",
            # hidden: against references written out
            "tests/hidden/test_hidden_llama.py::test_llama31_rope_frequencies",
            "tests/hidden/test_hidden_llama.py::test_apply_rotary_is_meta_rotary",
            "tests/hidden/test_hidden_llama.py::test_gqa_attention_equals_explicit_head_repetition",
            "tests/hidden/test_hidden_llama.py::test_hf_permute_moves_each_row_where_hf_wants_it",
            "tests/hidden/test_hidden_decoding.py::test_cached_sbd_equals_uncached[3-4-llama-tiny]",
        ]),
    # experiments: run the reference (or your own solutions), measure, write up; CPU budget <= 15
    # minutes each
    dict(number=7, title="The γ trade-off of the demo model", kind="experiment", points=5,
         builds_on=[1, 2, 3, 4, 5], writeup="07_gamma_tradeoff.md", functions=[], tests=[]),
    dict(number=8, title="Ablation: SBD without the NTP term", kind="experiment", points=5,
         builds_on=[1, 2, 3, 4, 5], writeup="08_no_ntp_ablation.md", functions=[], tests=[]),
    dict(number=9, title="Where training blocks start: block_phase 'answer' vs 'random'",
         kind="experiment", points=5, builds_on=[1, 2, 3, 4, 5], writeup="09_block_phase.md",
         functions=[], tests=[]),
    dict(number=10, title="Eq. 16 on your own machine", kind="experiment", points=5,
         builds_on=[3, 5], writeup="10_eq16_wall_clock.md", functions=[], tests=[]),
    dict(number=11, title="Exact mode: what checking drafts costs", kind="experiment", points=5,
         builds_on=[1, 2, 3, 4, 5], writeup="11_exact_mode.md", functions=[], tests=[]),
    dict(number=12, title="Why reasoning traces suit SBD", kind="experiment", points=5,
         builds_on=[1, 2, 3, 4, 5], writeup="12_traces.md", functions=[], tests=[]),
    # a design assignment: the goal is given, the rule is the student's; graded by behaviour
    dict(
        number=13, title="Design: token shift", kind="design", points=15,
        builds_on=[1, 2, 3, 4, 5], writeup="13_token_shift.md",
        functions=["sbd.py:shift_read_at", "sbd.py:shift_labels"],
        withheld=["README.md#Token shift",
                  "docs/method.md#Token shift: the masked-token head starts as the next-token head "
                  "(not in the paper)",
                  "docs/findings.md#Token shift and complementary masks: a 200-step screen"],
        tests=[
            "tests/test_assignment_13.py::test_labels_never_show_a_slot_its_target",
            "tests/test_assignment_13.py::test_a_short_run_from_an_ntp_model_learns_fast",
            "tests/hidden/test_hidden_assignment_13.py::test_decoding_reads_where_training_taught",
            ("tests/hidden/test_hidden_assignment_13.py::"
             "test_a_next_token_drafter_drafts_every_token_right"),
            "tests/hidden/test_hidden_assignment_13.py::test_cached_decoding_equals_uncached",
        ]),
    # graded experiments: change the code (or a setting), run a seeded small version, report the
    # numbers; the grader runs it again (tests/test_experiments.py)
    dict(number=14, title="Experiment: a leaky training mask", kind="measurement", points=5,
         builds_on=[1, 2, 3, 4, 5], writeup="14_leaky_mask.md",
         functions=["assignments/experiments.py:leaky_training_mask"],
         tests=["tests/test_experiments.py::test_leak_numbers_are_what_the_run_gives",
                "tests/hidden/test_hidden_experiments.py::test_the_leak_is_the_one_described"]),
    dict(number=15, title="Experiment: the NTP term, measured", kind="measurement", points=5,
         builds_on=[1, 2, 3, 4, 5], writeup="15_ntp_term.md", functions=[],
         tests=["tests/test_experiments.py::test_ntp_numbers_are_what_the_run_gives"]),
    dict(number=16, title="Experiment: what token shift buys", kind="measurement", points=5,
         builds_on=[1, 2, 3, 4, 5, 13], writeup="16_shift_measured.md", functions=[],
         tests=["tests/test_experiments.py::test_shift_numbers_are_what_the_run_gives"]),
]

# The graded questions of each implementation assignment (see "questions" above), by assignment
# number. Each write-up's "## Graded questions" asks them; answers.toml is the student's form.
QUESTIONS = {
    1: [
        dict(id="1.1", points=1, kind="ints", salt="471279249377",
             digest="16d8ea3495357359d95dbfc2ac80be24"
                    "5953c12a38ee07de834995d28892f420"),
        dict(id="1.2", points=1, kind="ints", salt="96186493c1d1",
             digest="3aa4982cd793518ecbefe177fe47c7b1"
                    "070d3861a0c1b01b44e0615a11be34ac"),
        dict(id="1.3", points=1, kind="ints", salt="e416000bb1c1",
             digest="28a0c326079e8e7bc5371bf29ea312ce"
                    "a8653b731e1d1b59a67bdd42cc151cf2"),
    ],
    2: [
        dict(id="2.1", points=1, kind="ints", salt="8a9dc8dfa771",
             digest="1921052d9699cc3b857726afe65ecb5e"
                    "d4f95917a3ba2a94b5092a2fd36f4166"),
        dict(id="2.2", points=1, kind="numbers:2", salt="c52a3389f18c",
             digest="7742e69c8f13fbd282acda88ec9d1ef1"
                    "cf3db4964b0b21bd33ee42876131dd7e"),
        dict(id="2.3", points=1, kind="numbers:4", salt="35e4903803ed",
             digest="1a988e6a86d8060c295659b0c883d43c"
                    "85a5aac90de46f0e3c8ed2c189d95ed6"),
    ],
    3: [
        dict(id="3.1", points=1, kind="ints", salt="ebd032e0b604",
             digest="2e54f9184c3dfddcaee18dda9384dd2a"
                    "83d73fea479ffc7012760d3d781264a8"),
        dict(id="3.2", points=1, kind="ints", salt="4f88a14cf7d1",
             digest="4ea975c8977862332d8f4cbbf8a1c9dd"
                    "1d8df4bea669b0dd33cce44ebf27a007"),
    ],
    4: [
        dict(id="4.1", points=1, kind="ints", salt="400b54ca04ca",
             digest="66e52b8949741bff6e884b8775c916f0"
                    "ed2dbff7bb31955f3227bd21184c6fd0"),
        dict(id="4.2", points=1, kind="ints", salt="09b48533a202",
             digest="acd3be612dbe961a8001d383811120b2"
                    "366f98a5b2686013b8eff4b51820b790"),
        dict(id="4.3", points=1, kind="ints", salt="ec60a9007efc",
             digest="c32f12d55c029d1ed8a5f8557d753b57"
                    "3aa4dee80eebe76130c9d922dd1bcd70"),
    ],
    5: [
        dict(id="5.1", points=1, kind="ints", salt="4185aef30630",
             digest="c142d963e4e96a9bcc9696c075a79f1a"
                    "a99991b817bf88d3d2bb082b6ae6c1fa"),
        dict(id="5.2", points=1, kind="numbers:2", salt="7a435ffc94f8",
             digest="a134138c985c1134d925ee6afd74f93d"
                    "f7acfdc1e6f849b1a0b150a99dc20206"),
        dict(id="5.3", points=1, kind="ints", salt="4f70efec0b17",
             digest="9a360fb20cf1eec26178daf95d5e73e6"
                    "07c86e3aec73e3195e8f48b1298107b5"),
        dict(id="5.4", points=1, kind="ints", salt="b011dacbe867",
             digest="c28f8ce996750fde4eebcfc786cb5eae"
                    "5d625deb972813440bb6173300c07bd6"),
    ],
    6: [
        dict(id="6.1", points=1, kind="ints", salt="b54b58f2c62e",
             digest="4a6687c18e6c4b53a1950862f32cf975"
                    "500b7c75d4b5d2121bc0ef3d41650beb"),
        dict(id="6.2", points=1, kind="ints", salt="54ec4d15090a",
             digest="5c764913762b6c4b97b2f62cfb00d2cb"
                    "e3482981d11664ab8648dcf193882b89"),
        dict(id="6.3", points=1, kind="numbers:2", salt="f4a8d5a34f25",
             digest="28495f58c1b1d8338728944ebdc1cdfd"
                    "52ce4fe2f1de87aea3e48857568d57b9"),
    ],
}

# Docstrings for blanked functions that have none in the source: the handout puts this text in its
# place, so the student still gets a specification. An entry for a function that has a docstring is
# an error (stale entry).
SPECS = {}

# The hidden tests: reference implementations of blanked functions and the checks that use them.
# A student's handout leaves them out (handout.py); the autograder's copy (--hidden) and CI keep
# them. grade.py marks a listed test it cannot find here as hidden.
HIDDEN = "tests/hidden/"

# Files of the repository that a handout leaves out: checks for course staff, not for students.
STAFF_ONLY = ["tests/test_assignments.py", "tests/test_assignment_leaks.py",
              "tests/test_assignment_questions.py", "assignments/answers_reference.toml"]
