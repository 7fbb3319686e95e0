"""The night: the campaign's typed configuration (campaign, schema), the loop that runs arms until
the budget ends (loop, arm_runner), the search over Optuna (search, sampler, study), the statistics
that decide (compare, verdict), and the journal with its one read model (journal writes, readback
reads, records types each line, state replays them). Nothing here imports the morning or production."""
