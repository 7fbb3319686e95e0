"""Production: a campaign's winner written to the production service and taken back — promote and
rollback (promote), what a promotion reads and checks (context), the unit, Quadlet and env-file
forms of a shape (units, envfile, unitsyntax), and `tuner init --from-container` (init)."""
