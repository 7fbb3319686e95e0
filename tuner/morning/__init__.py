"""The morning: readers of a campaign folder — status, the live view, the report and its sections
and plots, export, the dashboard, terminal renderings. They read through tuner.night.readback and
tuner.night.state and never write a journal, a study, a lock or a unit."""
