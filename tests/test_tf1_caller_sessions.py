"""tf1/caller_sessions.py: a use of an optimizer-building class or function of another module,
reached while a Session the caller opened first exists (maddpg's driver), and the uses that are not."""

import textwrap

import pytest

from ampify.transforms.tf1.caller_sessions import session_before_use


def _find(source: str, name: str = "Agent"):
    return session_before_use(textwrap.dedent(source).encode(), name)


def test_a_use_inside_a_with_session_block_through_a_function_of_the_module():
    found = _find("""
        import tf_util as U
        from agent import Agent

        def get_agents(n):
            maker = Agent
            return [maker(i) for i in range(n)]

        def train():
            with U.single_threaded_session():
                agents = get_agents(2)
    """)
    assert (found.use_line, found.session_line, found.session_code, found.chain) == (
        6, 10, "U.single_threaded_session()", ("get_agents",))


def test_a_use_after_a_session_assigned_in_the_same_block():
    found = _find("""
        import tensorflow as tf
        from agent import Agent
        sess = tf.Session()
        agent = Agent(sess)
    """)
    assert (found.use_line, found.session_line, found.chain) == (5, 4, ())


@pytest.mark.parametrize("source", [
    # the Session comes after the agents are built
    """
    import tensorflow as tf
    from agent import Agent
    agent = Agent()
    sess = tf.Session()
    """,
    # a graph scope is not a Session
    """
    import tensorflow as tf
    from agent import Agent
    with tf.Graph().as_default():
        agent = Agent()
    """,
    # the with block closes before the use
    """
    import tensorflow as tf
    from agent import Agent
    def main():
        with tf.Session() as sess:
            sess.run(tf.no_op())
        agent = Agent()
    """,
    # a session hook or config is not a Session
    """
    import tensorflow as tf
    from agent import Agent
    with make_session_config():
        agent = Agent()
    """,
    # a function defined inside the with block runs when it is called, not there
    """
    import tensorflow as tf
    from agent import Agent
    with tf.Session() as sess:
        def later():
            return Agent()
    """,
])
def test_uses_outside_an_open_session_are_not_reported(source):
    assert _find(source) is None


def test_a_source_that_does_not_parse_reports_nothing():
    assert session_before_use(b"def broken(:\n", "Agent") is None
