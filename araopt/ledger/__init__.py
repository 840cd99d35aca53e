"""The release ledger, engine-free: which conversions each release used (``ledger``: check and record
at commit, lookback costing, the lookback's own-rows check), the one check-and-record step both APIs'
``measure`` run at commit (``commit``), and which recorded releases the privacy-safe tuner may learn
from (``verify``). Above ``version`` (an entry records the mechanism it released with), below the
workflows that record releases."""
