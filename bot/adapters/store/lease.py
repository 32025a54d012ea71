"""Table `leader_lease`: the lease of the bot that leads on a shared PostgreSQL database (bot.adapters.leader):
which bot holds it (`holder`, `host:pid`), the database session that holds the leader's advisory lock
(`backend_pid`, PostgreSQL's pg_backend_pid()) and until when it holds it (`expires_at`, epoch seconds of the
database's clock). The leader renews it with every heartbeat; a follower that finds it expired ends that session
(pg_terminate_backend), which frees the lock for it: a frozen leader (SIGSTOP, a paused VM) loses the lead within
the lease, not when its TCP connection finally dies."""

from __future__ import annotations

from sqlalchemy import Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from bot.adapters.store.db import Base


class LeaseRow(Base):
    """One row per lease `name` (`leader`): `holder`, `backend_pid`, `expires_at` (see the module's docstring)."""

    __tablename__ = "leader_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200), default="")
    backend_pid: Mapped[int] = mapped_column(Integer, default=0)
    expires_at: Mapped[float] = mapped_column(Float, default=0.0)
