"""Small helpers with no evalsup imports of their own, used by more than one package: process tuning (GC) and
the way a duration is written for a person."""
